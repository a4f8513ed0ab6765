"""Host readers: every byte gpu-monitor reads from the machine comes through this package.

Each reader takes its source (``HostPaths``, an NVML module object, a command runner) in its
constructor, so tests and the simulated node hand in fakes at the lowest boundary.
"""
