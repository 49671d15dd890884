"""What keeps a snippet away from its executor and from the next snippet: prctl and seccomp.

The executor makes itself non-dumpable (``PR_SET_DUMPABLE`` 0: no ptrace attach, no
``/proc/<pid>/mem``, ``fd`` or ``environ`` for processes of the same uid) and installs, on
itself and so on every snippet it forks, a seccomp filter (inherited by everything a snippet
starts, irremovable; the executor makes none of the denied calls) that answers ``EPERM`` to the
calls that could still reach another process of the same uid or leave state behind after the
snippet's processes are gone:

* other processes: ``ptrace``, ``process_vm_readv/writev``, ``pidfd_getfd``, ``kcmp``,
  ``move_pages``/``migrate_pages``, and ``prlimit64``, ``setpriority``, ``sched_set*``,
  ``ioprio_set`` on any process but itself;
* state that outlives processes: SysV IPC objects (``shmget``/``msgget``/``semget``), POSIX
  message queues (``mq_open``), kernel keyrings (``add_key``, ``keyctl``, ``request_key``);
* new namespaces (``unshare``, ``setns``, ``clone`` with a namespace flag; ``clone3`` answers
  ``ENOSYS`` so libc falls back to ``clone``), ``bpf``, ``perf_event_open``, ``userfaultfd``;
* ``io_uring_setup`` / ``_enter`` / ``_register``: the operations of a ring run in kernel workers,
  out of this filter's sight (they would bypass every rule above);
* syscalls of a foreign ABI (i386/x32 on x86_64), which would bypass the numbers above.

Filters are built for x86_64 and aarch64; elsewhere ``seccomp_program`` returns None and the
hello frame says so.  Stdlib only (this package runs inside containers).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_PR_SET_DUMPABLE = 4
_PR_SET_NAME = 15
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_ALLOW = 0x7FFF0000
_EPERM = 0x00050000 | errno.EPERM
_ENOSYS = 0x00050000 | errno.ENOSYS
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_NAMESPACE_FLAGS = 0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000  # NEWTIME NEWNS NEWCGROUP NEWUTS NEWIPC NEWUSER NEWPID NEWNET

# name: (x86_64, aarch64) syscall numbers
_DENY = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kcmp": (312, 272), "pidfd_getfd": (438, 438), "move_pages": (279, 239),
    "migrate_pages": (256, 238), "shmget": (29, 194), "msgget": (68, 186), "semget": (64, 190),
    "mq_open": (240, 180), "add_key": (248, 217), "keyctl": (250, 219),
    "request_key": (249, 218), "unshare": (272, 97), "setns": (308, 268), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
}
_SELF_ONLY = {  # name: (x86_64, aarch64, index of the pid argument): denied unless that argument is 0
    "prlimit64": (302, 261, 0), "setpriority": (141, 140, 1), "sched_setaffinity": (203, 122, 0),
    "sched_setscheduler": (144, 119, 0), "sched_setparam": (142, 118, 0),
    "sched_setattr": (314, 274, 0), "ioprio_set": (251, 30, 1),
}
_CLONE, _CLONE3 = (56, 220), (435, 435)
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # machine: (column, AUDIT_ARCH)


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _arg(index: int, high: bool = False) -> int:
    return 16 + 8 * index + (4 if high else 0)  # offset in struct seccomp_data (little-endian)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The BPF filter (``struct sock_filter`` array) for this machine, or None if unsupported."""
    column, audit_arch = _ARCHES.get(machine or platform.machine(), (None, None))
    if column is None:
        return None
    prog = [_op(_LD_W_ABS, 4), _op(_JEQ, audit_arch, 1, 0), _op(_RET, _EPERM), _op(_LD_W_ABS, 0)]
    if column == 0:  # x32 syscalls share the x86_64 arch value, with bit 30 set in the number
        prog += [_op(_JGE, 0x40000000, 0, 1), _op(_RET, _EPERM)]
    for numbers in _DENY.values():
        prog += [_op(_JEQ, numbers[column], 0, 1), _op(_RET, _EPERM)]
    prog += [_op(_JEQ, _CLONE3[column], 0, 1), _op(_RET, _ENOSYS)]
    for x86, arm, index in _SELF_ONLY.values():
        prog += [_op(_JEQ, (x86, arm)[column], 0, 7), _op(_LD_W_ABS, _arg(index)),
                 _op(_JEQ, 0, 1, 0), _op(_RET, _EPERM), _op(_LD_W_ABS, _arg(index, high=True)),
                 _op(_JEQ, 0, 0, 1), _op(_RET, _ALLOW), _op(_RET, _EPERM)]
    prog += [_op(_JEQ, _CLONE[column], 0, 4), _op(_LD_W_ABS, _arg(0)),
             _op(_JSET, _NAMESPACE_FLAGS, 0, 1), _op(_RET, _EPERM), _op(_RET, _ALLOW)]
    prog.append(_op(_RET, _ALLOW))
    return b"".join(prog)


_SIGNAL_PID = {  # name: (x86_64, aarch64): calls whose first argument names the process signalled
    "kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131), "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240), "pidfd_open": (434, 434),
}
_PIDFD_SEND_SIGNAL = (424, 424)


def protect_pid_program(pid: int, machine: str | None = None) -> bytes | None:
    """A second filter layer: no signal to process ``pid`` (nor to its group, nor to every
    process with ``kill(-1)``), no ``pidfd_send_signal`` at all (a ``/proc/<pid>`` directory
    works as a pidfd).  The forker installs it on itself, so the snippets it clones cannot stop
    or kill it (``executor/forker.py``)."""
    column, audit_arch = _ARCHES.get(machine or platform.machine(), (None, None))
    if column is None:
        return None
    targets = (pid & 0xFFFFFFFF, -pid & 0xFFFFFFFF, 0xFFFFFFFF)  # pid, its group, everyone (kill)
    prog = [_op(_LD_W_ABS, 4), _op(_JEQ, audit_arch, 1, 0), _op(_RET, _EPERM), _op(_LD_W_ABS, 0),
            _op(_JEQ, _PIDFD_SEND_SIGNAL[column], 0, 1), _op(_RET, _EPERM)]
    for numbers in _SIGNAL_PID.values():
        # nr? then: arg0 one of the targets -> EPERM (3 - i ahead), else ALLOW; not nr: skip 6
        prog += [_op(_JEQ, numbers[column], 0, 6), _op(_LD_W_ABS, _arg(0)),
                 *[_op(_JEQ, t, 3 - i, 0) for i, t in enumerate(targets)], _op(_RET, _ALLOW), _op(_RET, _EPERM)]
    prog.append(_op(_RET, _ALLOW))
    return b"".join(prog)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Guard:
    """Built once in the executor; ``apply()`` runs in each forked child (a few syscalls)."""

    def __init__(self, enabled: bool = True):
        self._prctl = ctypes.CDLL(None, use_errno=True).prctl
        self._prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        try:
            with open("/proc/self/comm", "rb") as fh:
                name = fh.read().strip()[:15]
        except OSError:
            name = b"python3"
        self._name_buffer = ctypes.create_string_buffer(name)
        self._name = ctypes.addressof(self._name_buffer)
        program = seccomp_program() if enabled else None
        self.seccomp = program is not None
        if program is not None:
            self._buffer = ctypes.create_string_buffer(program, len(program))
            self._fprog = _Fprog(len(program) // 8, ctypes.addressof(self._buffer))

    def protect_executor(self) -> bool:
        """Make this process non-dumpable; True on success."""
        return self._prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0

    def install(self, program: bytes | None = None) -> None:
        """No new privileges, then the seccomp filter (or ``program``, a further layer), on this
        process and everything it will fork (the executor installs it on itself once, so each
        child pays nothing for it: the executor itself makes none of the denied calls).
        ``OSError`` when a step fails."""
        if not self.seccomp:
            return
        fprog = self._fprog
        if program is not None:
            buffer = ctypes.create_string_buffer(program, len(program))
            fprog = _Fprog(len(program) // 8, ctypes.addressof(buffer))
        if self._prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or self._prctl(
                _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp filter not installed: {errno.errorcode.get(err, err)}")

    def apply(self) -> None:
        """In the snippet's process: dumpable again, so its own ``/proc/self`` files stay its own
        (the filter is inherited from the executor), and the executor's process name back (a
        child cloned by the forker inherits the forker's)."""
        self._prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        self._prctl(_PR_SET_NAME, self._name, 0, 0, 0)
