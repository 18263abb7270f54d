"""vramguard's test bench, never part of the agent's wheel or image.

- `cgroups`: real kubelet-shaped pod and container cgroups (cgroupfs and systemd drivers, v1 and v2).
- `fakenvml`: builds the test NVML library (`fake_nvml.c`, compiled against NVIDIA's `nvml.h`) and writes its state.
- `simnode`: a simulated GPU node from the two, with the real agent running against it.
- `demo`: the narrated demo of the README's first command.
- `fakes`: hand-written fakes of the agent's Protocols (`vramguard.core.ports`) and builders of test data, for
  the unit tests and the bench.
"""
