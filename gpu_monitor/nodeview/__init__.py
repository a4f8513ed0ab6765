"""The node on the command line: ``gpu-monitor status``, ``history`` and ``explain``.

Why a package of its own: these commands read what the daemon wrote (the state store, through
state/readonly.py) and what the runbook says (runbook.py), and print it; they run no check and
build no host, so they need none of gpu_monitor/cli.py's wiring, which only registers them
(cli.py here). status.py, history.py and explain.py each build one JSON document; render.py
draws the tables from those documents. docs/cli.md describes the commands.
"""
