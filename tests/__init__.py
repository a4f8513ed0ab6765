"""The test suite, laid out like the code it tests.

``tests/test_<module>.py`` tests ``gpu_monitor/<module>.py``; ``tests/<package>/test_<module>.py``
tests ``gpu_monitor/<package>/<module>.py`` (``tests/checks`` tests the top-level ``checks``
package); a module with more than one test file adds what the file covers:
``test_<module>_<aspect>.py``. Three folders are not mirrors: ``badinput`` (one end-to-end table
per class of bad input), ``deploy`` (the manifests in ``daemonset/``, the Dockerfiles and the
operator docs) and ``kube`` (the fake apiserver the Kubernetes tests run against, and its own
tests). ``tests`` is a package so that test modules are named by their path
(``tests.fabric.test_cli`` and ``tests.test_cli`` are two modules) and shared helpers are
imported by that path too (``from tests.waiting import eventually``).
"""
