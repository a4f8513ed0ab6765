"""The test suite, laid out like the code it tests.

``tests/test_<module>.py`` tests ``gpu_monitor/<module>.py``; ``tests/<package>/test_<module>.py``
tests ``gpu_monitor/<package>/<module>.py`` (``tests/checks`` tests the top-level ``checks``
package); a module with more than one test file adds what the file covers:
``test_<module>_<aspect>.py``. What a package's ``__init__`` holds is tested under the name of
what it holds (``tests/state/test_store.py``: ``Store``). Two folders are not mirrors:
``badinput`` (one end-to-end table per class of bad input) and ``deploy`` (the manifests in
``daemonset/``, the Dockerfiles and the operator docs). ``kube`` mirrors ``gpu_monitor/kube`` and
also holds the fake apiserver every Kubernetes test runs against (``fake_apiserver*.py``, tested
by ``test_fake_apiserver.py`` and ``test_kubectl_parity.py``) and ``client_helpers.py``,
gpu-monitor's client pointed at it. ``tests`` is a package so that test modules are named by their
path (``tests.fabric.test_cli`` and ``tests.test_cli`` are two modules) and shared helpers are
imported by that path too (``from tests.waiting import eventually``).
"""
