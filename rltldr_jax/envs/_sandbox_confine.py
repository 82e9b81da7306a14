"""OS-level confinement of the sandbox child: a seccomp-bpf filter and a Landlock ruleset (standard library only).

These are the layers that hold when Python-level defences do not (an audit hook applies to one interpreter only: a
subinterpreter, ctypes or any native code runs without it). The kernel enforces both on every thread of the child,
native code included, and neither can be lifted once applied.

seccomp (`seccomp_program`, any Linux >= 3.17 on x86-64 or AArch64): no new processes (fork, vfork, execve,
execveat, clone without CLONE_THREAD; clone3 answers ENOSYS so that glibc falls back to clone for threads); signals
only to the child itself (kill of its own pid, 0 or its own group; tgkill of its own thread group; no tkill,
rt_sigqueueinfo, pidfds); no ptrace or cross-process memory access; no sockets (socket(2) is refused; socketpair is
allowed), connect or bind; no namespaces, mounts or chroot; no io_uring (its operations bypass seccomp), bpf,
perf_event_open, userfaultfd, keyrings, modules, kexec, reboot, syslog, swap, quotas, hostname changes or
open_by_handle_at; no PR_SET_DUMPABLE (the child stays undumpable). Any other architecture's system calls (x32 on
x86-64 included) kill the process.

Landlock (`apply_landlock`, Linux >= 5.13 with Landlock enabled; the ABI version decides what is covered): the
child may create, write, remove and rename only under its working directory; it may read only the interpreter's
standard library and the system's shared libraries (site-packages and dist-packages left out, so the trainer's
packages and their data files stay unreadable), /etc, the time-zone database, its own /proc entry and a few
devices; it may execute nothing. ABI >= 4: no TCP bind/connect. ABI >= 6: no signals to, and no abstract Unix
sockets of, processes outside the child's own Landlock domain (so no two sandboxes can signal each other).

This file's text is sent to the child with its configuration and executed there, before any agent code; it must
run on any Python >= 3.8 (the child may be the system interpreter) and import nothing outside the standard library.
"""

import ctypes
import os
import platform
import struct

# ------------------------------------------------------------------------------------------------------ seccomp

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

#: System call numbers (x86-64: asm/unistd_64.h; AArch64: asm-generic/unistd.h; "-": none) and whether the filter
#: refuses the call outright with EPERM. clone3, clone, kill, tgkill and prctl are decided by the rules below.
_TABLE = """
fork                     57        -  deny
vfork                    58        -  deny
execve                   59      221  deny
execveat                322      281  deny
clone                    56      220
clone3                  435      435
kill                     62      129
tkill                   200      130  deny
tgkill                  234      131
rt_sigqueueinfo         129      138  deny
rt_tgsigqueueinfo       297      240  deny
ptrace                  101      117  deny
process_vm_readv        310      270  deny
process_vm_writev       311      271  deny
kcmp                    312      272  deny
process_madvise         440      440  deny
pidfd_open              434      434  deny
pidfd_send_signal       424      424  deny
pidfd_getfd             438      438  deny
unshare                 272       97  deny
setns                   308      268  deny
mount                   165       40  deny
umount2                 166       39  deny
pivot_root              155       41  deny
chroot                  161       51  deny
open_tree               428      428  deny
move_mount              429      429  deny
fsopen                  430      430  deny
fsconfig                431      431  deny
fsmount                 432      432  deny
fspick                  433      433  deny
mount_setattr           442      442  deny
io_uring_setup          425      425  deny
io_uring_enter          426      426  deny
io_uring_register       427      427  deny
bpf                     321      280  deny
perf_event_open         298      241  deny
userfaultfd             323      282  deny
keyctl                  250      219  deny
add_key                 248      217  deny
request_key             249      218  deny
init_module             175      105  deny
finit_module            313      273  deny
delete_module           176      106  deny
kexec_load              246      104  deny
kexec_file_load         320      294  deny
reboot                  169      142  deny
syslog                  103      116  deny
socket                   41      198  deny
connect                  42      203  deny
bind                     49      200  deny
open_by_handle_at       304      265  deny
acct                    163       89  deny
swapon                  167      224  deny
swapoff                 168      225  deny
quotactl                179       60  deny
sethostname             170      161  deny
setdomainname           171      162  deny
vhangup                 153       58  deny
prctl                   157      167
"""
_ROWS = [line.split() for line in _TABLE.strip().splitlines()]
_SYSCALLS = {
    arch: {row[0]: int(row[1 + i]) for row in _ROWS if row[1 + i] != "-"}
    for i, arch in enumerate(("x86_64", "aarch64"))
}
_DENIED = tuple(row[0] for row in _ROWS if row[-1] == "deny")

_CLONE_THREAD = 0x00010000
_PR_SET_DUMPABLE = 4
_EPERM, _ENOSYS = 1, 38

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ, _JGE, _JSET = 0x15, 0x35, 0x45  # BPF_JMP | BPF_{JEQ,JGE,JSET} | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (args[0]: its low 32 bits, little-endian)


def machine() -> str:
    """The architecture name used in `_SYSCALLS` ("x86_64", "aarch64", or what the platform reports)."""
    name = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def seccomp_program(arch: str, pid: int) -> bytes:
    """The classic-BPF filter (packed `struct sock_filter` array) for a child whose pid is `pid`.

    Raises:
      ValueError: no system call table for `arch`.
    """
    if arch not in _SYSCALLS:
        raise ValueError(f"no seccomp table for architecture {arch!r} (have {sorted(_SYSCALLS)})")
    nr = _SYSCALLS[arch]
    code = []  # (opcode, jump-if-true label or None, jump-if-false label or None, k); None = next instruction
    labels = {}

    def op(opcode, k=0, jt=None, jf=None):
        code.append((opcode, jt, jf, k))

    def label(name):
        labels[name] = len(code)

    op(_LD_W_ABS, _ARCH)
    op(_JEQ, _AUDIT_ARCH[arch], None, "kill")
    op(_LD_W_ABS, _NR)
    if arch == "x86_64":
        op(_JGE, _X32_SYSCALL_BIT, "kill", None)
    for name in _DENIED:
        if name in nr:
            op(_JEQ, nr[name], "deny", None)
    op(_JEQ, nr["clone3"], "enosys", None)
    op(_JEQ, nr["clone"], "clone", None)
    op(_JEQ, nr["kill"], "kill_arg", None)
    op(_JEQ, nr["tgkill"], "tgkill_arg", None)
    op(_JEQ, nr["prctl"], "prctl_arg", None)
    op(_RET, _RET_ALLOW)
    label("clone")
    op(_LD_W_ABS, _ARG0)
    op(_JSET, _CLONE_THREAD, "allow", "deny")
    label("kill_arg")  # kill(pid): itself, 0 (its own group) or -pid (its own group: the child leads it)
    op(_LD_W_ABS, _ARG0)
    op(_JEQ, pid, "allow", None)
    op(_JEQ, 0, "allow", None)
    op(_JEQ, (-pid) & 0xFFFFFFFF, "allow", "deny")
    label("tgkill_arg")
    op(_LD_W_ABS, _ARG0)
    op(_JEQ, pid, "allow", "deny")
    label("prctl_arg")
    op(_LD_W_ABS, _ARG0)
    op(_JEQ, _PR_SET_DUMPABLE, "deny", "allow")
    label("allow")
    op(_RET, _RET_ALLOW)
    label("deny")
    op(_RET, _RET_ERRNO | _EPERM)
    label("enosys")
    op(_RET, _RET_ERRNO | _ENOSYS)
    label("kill")
    op(_RET, _RET_KILL_PROCESS)

    out = []
    for i, (opcode, jt, jf, k) in enumerate(code):
        offsets = []
        for target in (jt, jf):
            offset = 0 if target is None else labels[target] - i - 1
            if not 0 <= offset <= 255:
                raise AssertionError(f"seccomp jump out of range at {i}")
            offsets.append(offset)
        out.append(struct.pack("=HBBI", opcode, offsets[0], offsets[1], k))
    return b"".join(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def no_new_privs(libc) -> None:
    """PR_SET_NO_NEW_PRIVS: execve can never grant privileges again (required for unprivileged seccomp/Landlock)."""
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def apply_seccomp(libc, pid: int) -> bool:
    """Installs `seccomp_program` on the calling (single-threaded) process; False where the architecture has no
    table. Raises OSError when the kernel refuses it."""
    arch = machine()
    if arch not in _SYSCALLS:
        return False
    program = seccomp_program(arch, pid)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    no_new_privs(libc)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return True


# ----------------------------------------------------------------------------------------------------- Landlock

_NR_LANDLOCK_CREATE_RULESET, _NR_LANDLOCK_ADD_RULE, _NR_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # all architectures
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE  # the rights a rule on a non-directory may hold
_READ = FS_READ_FILE | FS_READ_DIR


def landlock_abi(libc) -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    version = libc.syscall(_NR_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    return rights


def read_roots(stdlib_dir: str) -> list:
    """(path, rights) rules that let the interpreter run: its standard library and the shared libraries.

    Each library root (the interpreter's `<prefix>/lib` and the system's lib directories) gets READ_DIR on itself and
    read rights on each entry, but a `python*` entry is opened one level further so that its `site-packages` and
    `dist-packages` stay unreadable (listing their names remains possible)."""
    rules = []
    roots = [os.path.dirname(stdlib_dir)]
    roots += ["/lib", "/lib64", "/lib32", "/libx32", "/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/local/lib"]
    seen = set()
    for root in roots:
        real = os.path.realpath(root)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        rules.append((real, FS_READ_DIR))
        try:
            entries = sorted(os.listdir(real))
        except OSError:
            continue
        for name in entries:
            path = os.path.join(real, name)
            if name.startswith("python") and os.path.isdir(path) and not os.path.islink(path):
                rules.append((path, FS_READ_DIR))
                try:
                    inner = sorted(os.listdir(path))
                except OSError:
                    continue
                rules += [(os.path.join(path, n), _READ) for n in inner if n not in ("site-packages", "dist-packages")]
            else:
                rules.append((path, _READ))
    for extra in ("/etc", "/usr/share/zoneinfo"):
        rules.append((extra, _READ))
    rules += [(f"/dev/{name}", FS_READ_FILE) for name in ("zero", "random", "urandom", "full")]
    rules.append(("/dev/null", FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE))
    rules.append((f"/proc/{os.getpid()}", _READ))
    return rules


def workdir_rights(abi: int) -> int:
    """What the child may do under its working directory: everything handled but executing and device nodes."""
    return _handled_fs(abi) & ~(FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_BLOCK)


def apply_landlock(libc, workdir: str, rules: list) -> int:
    """Restricts the calling process to `rules` ((path, rights), missing paths skipped) plus `workdir`.

    Returns the ABI version applied (0: Landlock unavailable, nothing done). Raises OSError when the kernel refuses
    a step after Landlock was found (a half-applied ruleset is never left: restrict_self is the last call)."""
    abi = landlock_abi(libc)
    if abi <= 0:
        return 0
    handled = _handled_fs(abi)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    buffer = ctypes.create_string_buffer(attr[:size], size)
    ruleset = libc.syscall(_NR_LANDLOCK_CREATE_RULESET, buffer, ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, rights in list(rules) + [(workdir, workdir_rights(abi))]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a path this system does not have
            try:
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    rights &= _FILE_RIGHTS
                rights &= handled
                rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
                if rights and libc.syscall(_NR_LANDLOCK_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path!r}) failed")
            finally:
                os.close(fd)
        no_new_privs(libc)
        if libc.syscall(_NR_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi
