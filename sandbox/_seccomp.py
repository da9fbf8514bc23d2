"""A small seccomp-bpf deny-list for the local sandbox, compiled by hand (no libseccomp needed).

bubblewrap's ``--seccomp FD`` loads a raw ``struct sock_filter`` array. The filter returns ``EPERM`` for
system calls that sandboxed Python has no business making (ptrace, mount, keyrings, bpf, kernel modules,
namespace changes, io_uring, ...), kills the process on a foreign architecture or the x32 ABI, and allows
the rest. It is defence in depth: the namespaces and the absence of capabilities already stop most of these.
"""

from __future__ import annotations

import platform
import struct

__all__ = ["DENIED_SYSCALLS", "deny_filter"]

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
DENIED_SYSCALLS: dict[str, int] = {
    "ptrace": 101,
    "syslog": 103,
    "uselib": 134,
    "vhangup": 153,
    "pivot_root": 155,
    "_sysctl": 156,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_EPERM = 1


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def deny_filter() -> bytes | None:
    """The compiled filter for this machine, or None where no syscall table is shipped (not x86_64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    numbers = sorted(DENIED_SYSCALLS.values())
    checks = 1 + len(numbers)  # the x32 test and one compare per denied call
    prog = [
        _insn(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _insn(_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    # Instructions after the checks: [ALLOW, DENY]; a check at position p jumps to DENY.
    first = len(prog)
    deny_at = first + checks + 1
    prog.append(_insn(_JGE_K, deny_at - (first + 1), 0, _X32_SYSCALL_BIT))
    for i, nr in enumerate(numbers, start=1):
        pos = first + i
        prog.append(_insn(_JEQ_K, deny_at - (pos + 1), 0, nr))
    prog.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    prog.append(_insn(_RET_K, 0, 0, _RET_ERRNO | _EPERM))
    assert deny_at - (first + 1) < 256, "jump offset overflows a BPF byte"
    return b"".join(prog)
