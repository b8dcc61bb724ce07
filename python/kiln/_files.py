"""Files a step reads and writes: regular files only, folders replaced whole, nothing of the user's
removed."""
import errno
import os
import stat

from ._errors import KilnError

# The files of a saved step (Step.save): nothing else is ever written into, or removed from, its folder.
CHECKPOINT_FILES = ("step.so", "checkpoint.npz", "kiln.json")

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def open_regular(path):
    """A read-only descriptor of path, which must be a regular file: opened without blocking (a FIFO
    would wait for a writer forever) and checked before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise KilnError(f"cannot open {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise KilnError(f"{path} is not a regular file")
    return fd


def read_regular(path, limit=1 << 24):
    """The bytes of the regular file path, at most limit of them."""
    fd = open_regular(path)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise KilnError(f"{path} is larger than {limit} bytes")
    return data


def is_checkpoint(path):
    """Whether the folder path holds exactly a saved step's files, each a regular file."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return sorted(names) == sorted(CHECKPOINT_FILES) and all(
        stat.S_ISREG(os.lstat(os.path.join(path, n)).st_mode) for n in names)


def renameat2(a, b, flags):
    """renameat2(a, b, flags): True when it renamed, False where the system has no renameat2 (or the file
    system refuses the flags); other failures raise OSError."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def remove_checkpoint_dir(path):
    """Removes the folder path holding a saved step's files (or a failed save's), best effort: only those
    files, through a descriptor of the folder itself (never through a symbolic link), then the folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        for n in os.listdir(fd):
            if n in CHECKPOINT_FILES or n.startswith("checkpoint.npz"):
                try:
                    os.unlink(n, dir_fd=fd)
                except OSError:
                    pass
    finally:
        os.close(fd)
    try:
        os.rmdir(path)
    except OSError:
        pass


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask():
    """The process's umask, read without setting it (another thread may be creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
