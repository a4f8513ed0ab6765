"""The simulator's ``--inject`` fault kinds, declared by the domain they break.

Why a package: each domain's appliers change one part of the simulated ``NodeSpec`` and share
nothing with the others but the vocabulary in ``base.py``. ``gpu_monitor.sim.inject`` composes
the kinds into ``KINDS`` and parses ``KIND@TARGET[,key=value...]``; callers use that module.
"""
