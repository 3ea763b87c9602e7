"""Holding this process's CPU kernels to a lower class (`--amp-cpu-class`): the face the plugin
imports (`from harness.lab import hardware`). It re-exports from harness.lab.machine.cpu, where
the CPU's facts, its class and the kernel levels in force are read (harness.lab.machine.gpu has
the GPU's; docs/hardware.md).
"""

from harness.lab.machine.cpu import HOLD, NotInForce, check_held, hold

__all__ = ["HOLD", "NotInForce", "check_held", "hold"]
