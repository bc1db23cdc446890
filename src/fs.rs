//! File-system helpers: the store lock, the seam every sync and namespace change goes through
//! (directory syncs, whole-file-system syncs, creates, renames, removals), and (for the server)
//! `sendfile(2)` from a file to a socket.

use std::fs::File;
use std::io;
use std::path::Path;

use crate::error::{Error, Result};

mod headroom; // allocating ahead in steps, exactly what is needed on a nearly full disk
pub(crate) mod seam; // every durability point and namespace change, observable by a test
#[doc(hidden)]
pub mod sim; // the simulated disk behind the seam: power cuts and injected faults, for tests

pub(crate) use headroom::{Headroom, allocate_ahead};
pub(crate) use seam::{
    allocate, available_bytes, check_write, create, create_dir_all, open_create, remove_dir_all,
    remove_file, rename, set_len, sync_all, sync_data, sync_dir, sync_fs,
};

/// Makes everything written to the file system that holds `file` durable (`syncfs(2)`), and
/// reports any write-back error since the file was opened. The engine calls it through the seam
/// ([`sync_fs`]).
fn syncfs(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    #[expect(
        unsafe_code,
        reason = "syncfs(2) on an open descriptor we own; no memory is shared"
    )]
    // SAFETY: `file` is an open descriptor for the duration of the call; syncfs only reads it.
    let rc = unsafe { libc::syncfs(file.as_raw_fd()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Grows `file` to at least `offset + len` bytes and has the file system set blocks aside for
/// `[offset, offset + len)` (`fallocate(2)`, mode 0: the range reads as zeros), so that writing
/// into the range, and syncing what was written, allocates nothing: a full disk shows here, as
/// `ENOSPC`, before any byte is written, not at a later `write` or `fdatasync`. A file system
/// that cannot allocate ahead (`EOPNOTSUPP`), and systems other than Linux, get the length
/// alone (`set_len`, sparse): there a full disk may show only at the write or the sync.
/// The engine calls it through the seam ([`allocate`]).
fn fallocate(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let invalid = || std::io::Error::from(std::io::ErrorKind::InvalidInput);
        let at = libc::off_t::try_from(offset).map_err(|_| invalid())?;
        let n = libc::off_t::try_from(len).map_err(|_| invalid())?;
        loop {
            #[expect(
                unsafe_code,
                reason = "fallocate(2) on an open descriptor we own; no memory is shared"
            )]
            // SAFETY: `file` is an open descriptor for the duration of the call; fallocate
            // reads no memory of ours.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, at, n) };
            if rc == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EOPNOTSUPP | libc::ENOSYS) => break,
                _ => return Err(e),
            }
        }
    }
    let end = offset.saturating_add(len);
    if file.metadata()?.len() < end {
        file.set_len(end)?;
    }
    Ok(())
}

/// Starts writing back the dirty pages of `file` in `[offset, offset + len)` and returns without
/// waiting for them (`sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE`; elsewhere than Linux,
/// nothing). A hint, never a durability point: bytes are durable only
/// after a sync, and a write-back error shows at that sync. It may block while the disk is busy
/// (it allocates blocks and queues the writes), so the engine calls it only from a shard's
/// checkpoint thread, for ranges its committers noted as a journal or segment log grew: the
/// disk's work is spread over the time the bytes were written, a checkpoint's `syncfs` finds
/// little left to write, and the journal syncs that fall beside it do not queue behind one
/// burst of a whole checkpoint's data.
pub(crate) fn start_writeback(file: &File, offset: u64, len: u64) {
    sync_range(file, offset, len, false);
}

/// Writes `bufs`, in order, to `file` at `offset`, in as few calls as it takes (`pwritev(2)`, up
/// to 512 buffers a call, again for what a short write left), so bytes held in separate buffers
/// reach the file without first being copied into one.
#[cfg(not(target_os = "linux"))]
pub(crate) fn write_all_vectored_at(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut at = offset;
    for b in bufs {
        file.write_all_at(b, at)?;
        at += b.len() as u64;
    }
    Ok(())
}

/// As above (Linux: `pwritev(2)`).
#[cfg(target_os = "linux")]
pub(crate) fn write_all_vectored_at(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut offset = offset;
    let (mut i, mut skip) = (0usize, 0usize);
    while i < bufs.len() {
        let iov: Vec<libc::iovec> = bufs[i..]
            .iter()
            .take(512)
            .enumerate()
            .map(|(k, b)| {
                let b = if k == 0 { &b[skip..] } else { &b[..] };
                libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                }
            })
            .collect();
        let at = i64::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // At most 512, as taken above.
        let count = i32::try_from(iov.len()).unwrap_or(512);
        #[expect(
            unsafe_code,
            reason = "pwritev(2) reads the iovecs, which borrow `bufs` for the whole call"
        )]
        // SAFETY: every iovec points into a slice of `bufs`, alive and unchanged for the call;
        // the count is the vector's length (at most 512, under IOV_MAX).
        let n = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), count, at) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        let mut n = n as usize;
        offset += n as u64;
        while n > 0 && i < bufs.len() {
            let left = bufs[i].len() - skip;
            if n >= left {
                n -= left;
                i += 1;
                skip = 0;
            } else {
                skip += n;
                n = 0;
            }
        }
        while i < bufs.len() && bufs[i].len() == skip {
            i += 1;
            skip = 0;
        }
    }
    Ok(())
}

/// Writes back the dirty pages of `file` in `[offset, offset + len)` and waits until they are
/// written (`sync_file_range(2)`, waiting before and after; elsewhere than Linux, nothing). Not
/// a durability point either (no metadata is written, no cache flushed): it paces a large
/// write, a prepared journal file's zeros, so that the disk takes it a piece at a time between
/// the journal's own syncs, before the one `fdatasync` that makes it durable.
pub(crate) fn write_back_and_wait(file: &File, offset: u64, len: u64) {
    sync_range(file, offset, len, true);
}

fn sync_range(file: &File, offset: u64, len: u64, wait: bool) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (
            libc::off64_t::try_from(offset),
            libc::off64_t::try_from(len),
        ) else {
            return;
        };
        let flags = if wait {
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER
        } else {
            libc::SYNC_FILE_RANGE_WRITE
        };
        #[expect(
            unsafe_code,
            reason = "sync_file_range(2) on an open descriptor we own; no memory is shared"
        )]
        // SAFETY: `file` is an open descriptor for the duration of the call; the call only
        // writes the file's pages and waits for them.
        let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len, wait);
}

/// The bytes an unprivileged writer may still take on the file system holding `file`
/// (`fstatvfs(3)`: available blocks times the fragment size); `None` if it cannot say. The
/// engine calls it through the seam ([`available_bytes`]).
fn statvfs_available(file: &File) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        #[expect(
            unsafe_code,
            reason = "fstatvfs(3) fills a struct we own from an open descriptor"
        )]
        // SAFETY: `st` is valid for writes of one `statvfs`; the descriptor is open for the
        // call; on success the struct is initialized.
        let st = unsafe {
            if libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) != 0 {
                return None;
            }
            st.assume_init()
        };
        #[allow(
            clippy::useless_conversion,
            reason = "the fields' integer types differ between platforms"
        )]
        Some(u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        None
    }
}

/// Sends up to `len` bytes of `file`, from `offset`, to the socket `out` with `sendfile(2)`: the
/// kernel hands the file's page-cache pages to the socket, and no byte passes through user
/// memory. Returns the bytes sent (0 at the end of the file); a socket that is not ready fails
/// with `WouldBlock`.
///
/// A socket whose peer is gone raises SIGPIPE, as with any write without `MSG_NOSIGNAL`: use it
/// only when [`sigpipe_is_handled`].
#[cfg(feature = "http")]
pub(crate) fn send_file(
    out: std::os::fd::BorrowedFd<'_>,
    file: &File,
    offset: u64,
    len: usize,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut off = libc::off_t::try_from(offset)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    #[expect(
        unsafe_code,
        reason = "sendfile(2) between two open descriptors; the only memory it touches is `off`"
    )]
    // SAFETY: both descriptors are open for the duration of the call (`out` is borrowed, `file`
    // is referenced); `off` is a live, exclusively borrowed off_t that the kernel updates.
    let n = unsafe { libc::sendfile(out.as_raw_fd(), file.as_raw_fd(), &raw mut off, len) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// Whether SIGPIPE is ignored or handled in this process (not its default action, which ends
/// the process). Rust's runtime ignores it before `main` in every Rust program; a host that
/// restored the default must not have brook write to sockets without `MSG_NOSIGNAL`.
#[cfg(feature = "http")]
pub(crate) fn sigpipe_is_handled() -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    #[expect(
        unsafe_code,
        reason = "sigaction(2) only reads the current SIGPIPE disposition"
    )]
    // SAFETY: a null `act` changes nothing; `old` is a valid, writable sigaction that the call
    // fills in when it succeeds, and is read only then (a zeroed sigaction is valid anyway).
    let handler = unsafe {
        if libc::sigaction(libc::SIGPIPE, std::ptr::null(), old.as_mut_ptr()) != 0 {
            return false;
        }
        old.assume_init().sa_sigaction
    };
    handler != libc::SIG_DFL
}

/// The smoothed round-trip time the kernel holds for a TCP socket (`TCP_INFO`'s `tcpi_rtt`),
/// which for an accepted socket is measured on the handshake; `None` when unknown (zero: a
/// socket accepted by a SYN cookie has no measurement) or when the call fails.
#[cfg(feature = "http")]
pub(crate) fn tcp_rtt(socket: std::os::fd::BorrowedFd<'_>) -> Option<std::time::Duration> {
    use std::os::fd::AsRawFd;
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>()).ok()?;
    #[expect(
        unsafe_code,
        reason = "getsockopt(2) of TCP_INFO into a zeroed tcp_info of the length passed"
    )]
    // SAFETY: `info` is valid and writable for `len` bytes; the kernel writes at most `len`
    // bytes and sets `len` to what it wrote. A zeroed tcp_info is a valid value, so reading
    // fields the kernel did not write (an older kernel's shorter struct) reads zeros.
    let rtt = unsafe {
        let ret = libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &raw mut len,
        );
        if ret != 0 {
            return None;
        }
        info.assume_init().tcpi_rtt
    };
    (rtt > 0).then(|| std::time::Duration::from_micros(u64::from(rtt)))
}

/// Fixes a socket's send buffer at `bytes` (`SO_SNDBUF`: the kernel doubles the value for its
/// bookkeeping, caps it at `net.core.wmem_max`, and stops growing the buffer on its own).
#[cfg(feature = "http")]
pub(crate) fn set_send_buffer(
    socket: std::os::fd::BorrowedFd<'_>,
    bytes: usize,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::try_from(bytes)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    #[expect(
        unsafe_code,
        reason = "setsockopt(2) of SO_SNDBUF from a live c_int of the length passed"
    )]
    // SAFETY: `value` is a live c_int and `len` is its size; the kernel only reads it.
    let ret = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw const value).cast(),
            len,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A socket's send buffer as the kernel reports it (`SO_SNDBUF`: twice what was set).
#[cfg(all(test, feature = "http"))]
pub(crate) fn send_buffer(socket: std::os::fd::BorrowedFd<'_>) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut value: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    #[expect(
        unsafe_code,
        reason = "getsockopt(2) of SO_SNDBUF into a live c_int of the length passed"
    )]
    // SAFETY: `value` is a live, writable c_int and `len` its size.
    let ret = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw mut value).cast(),
            &raw mut len,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    usize::try_from(value).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))
}

/// The largest send buffer a socket can be given with `SO_SNDBUF` and still be as large as the
/// kernel would grow it on its own: the smaller of `net.core.wmem_max` and the third field of
/// `net.ipv4.tcp_wmem`. `None` when either cannot be read (not Linux).
#[cfg(feature = "http")]
pub(crate) fn send_buffer_ceiling() -> Option<usize> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let wmem_max: usize = read("/proc/sys/net/core/wmem_max")?.trim().parse().ok()?;
    let tcp_max: usize = read("/proc/sys/net/ipv4/tcp_wmem")?
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()?;
    Some(wmem_max.min(tcp_max))
}

/// Descriptors kept back from stream files for the journals, snapshots, listeners, logs and
/// the embedding program, in [`stream_files_for_descriptors`].
pub(crate) const DESCRIPTOR_RESERVE: u64 = 256;

/// The fewest descriptors [`stream_files_for_descriptors`] gives stream files, whatever the limit.
const MIN_STREAM_FILES: u64 = 128;

/// How many descriptors a server with `max_connections` connections can give its streams'
/// segment files (`Options::with_max_stream_files`) within its open-file limit, after raising
/// the soft limit to the hard one: `limit - max_connections - 256`, at least 128. An open
/// stream in use holds one per segment (its log; the index is only mapped); idle ones beyond the budget
/// are put at rest, their files closed. `None` when the limit cannot be read. The store's own
/// cap (half the limit, see [`Store::open`](crate::Store::open)) still applies on top.
pub fn stream_files_for_descriptors(max_connections: usize) -> Option<usize> {
    let limit = raise_open_file_limit()?;
    let conns = u64::try_from(max_connections).unwrap_or(u64::MAX);
    let fit = limit
        .saturating_sub(conns)
        .saturating_sub(DESCRIPTOR_RESERVE);
    Some(usize::try_from(fit.max(MIN_STREAM_FILES)).unwrap_or(usize::MAX))
}

/// The kernel's limit on memory maps per process (`vm.max_map_count`), or `None` when it cannot
/// be read (not Linux).
pub(crate) fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Raises this process's soft limit on open files to its hard limit (as the Go runtime does at
/// start) and returns the soft limit now in force; `None` when it cannot be read.
pub(crate) fn raise_open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    #[expect(
        unsafe_code,
        reason = "getrlimit(2)/setrlimit(2) on a local rlimit struct; no other memory is touched"
    )]
    // SAFETY: `lim` is a valid, writable rlimit for both calls; setrlimit only reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    Some(lim.rlim_cur)
}

/// Takes the store's exclusive lock (`LOCK` in the data directory), held until the file is dropped.
///
/// A lock still held is retried for up to `LOCK_PATIENCE`: a store closed and opened again by
/// the same process can find its old lock alive for a moment, when another thread forked a child
/// that has not yet `exec`ed (the child holds a copy of the descriptor until then).
pub(crate) fn lock(dir: &Path) -> Result<File> {
    const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))?;
    let since = std::time::Instant::now();
    loop {
        match f.try_lock() {
            Ok(()) => return Ok(f),
            Err(std::fs::TryLockError::WouldBlock) if since.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Err(Error::Locked(dir.to_path_buf())),
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        }
    }
}

/// The 16-byte key of a stream name: the first half of its SHA-256. Stream directories are named
/// by it, so no catalog has to be read at startup.
pub(crate) fn key(name: &str) -> [u8; 16] {
    use sha2::Digest;
    let d = sha2::Sha256::digest(name.as_bytes());
    let mut k = [0u8; 16];
    k.copy_from_slice(&d[..16]);
    k
}

/// Refuses a stream directory that is, or sits in a fan-out directory that is, a symbolic
/// link (`Corrupt`): brook never follows a link out of its data directory, to read or to
/// remove. A missing directory is fine (the stream does not exist, or is about to be created).
pub(crate) fn no_symlinks(stream_dir: &Path) -> Result<()> {
    let fan_out = stream_dir.parent();
    for p in std::iter::once(stream_dir).chain(fan_out) {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(Error::corrupt(
                    p,
                    "is a symbolic link; brook does not follow links in its data directory",
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The directory of a stream: `streams/{k[0]:02x}/{key as 32 hex digits}`. Hex-encoded by
/// table into one buffer (this runs on every open of a closed stream).
pub(crate) fn stream_dir(root: &Path, name: &str) -> std::path::PathBuf {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let k = key(name);
    let mut hex = [0u8; 32];
    for (i, b) in k.iter().enumerate() {
        hex[2 * i] = HEX[usize::from(b >> 4)];
        hex[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    let hex = std::str::from_utf8(&hex).expect("hex digits are ASCII");
    let mut dir = std::path::PathBuf::with_capacity(root.as_os_str().len() + 44);
    dir.push(root);
    dir.push("streams");
    dir.push(&hex[..2]);
    dir.push(hex);
    dir
}

#[cfg(test)]
mod tests {
    /// More buffers than one `pwritev` takes, empty ones among them, land in order.
    #[test]
    fn vectored_writes_land_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let owned: Vec<Vec<u8>> = (0..1300u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize * 3])
            .collect();
        let bufs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        super::write_all_vectored_at(&f, &bufs, 10).unwrap();
        let want: Vec<u8> = std::iter::repeat_n(0u8, 10).chain(owned.concat()).collect();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }

    /// The stream-file budget leaves the connections and a reserve, and never drops below its
    /// floor.
    #[test]
    fn stream_files_fit_the_descriptors_left() {
        let limit = super::raise_open_file_limit().expect("the open-file limit is readable");
        let none_left = usize::try_from(limit).unwrap();
        assert_eq!(super::stream_files_for_descriptors(none_left), Some(128));
        let want = (limit - 1000 - 256).max(128);
        assert_eq!(
            super::stream_files_for_descriptors(1000),
            Some(usize::try_from(want).unwrap())
        );
    }

    /// A stream's directory is its key's first byte, then the whole key, in lowercase hex.
    #[test]
    fn stream_dirs_are_the_key_in_lowercase_hex() {
        let k = super::key("a/b");
        let hex: String = k.iter().fold(String::new(), |mut s, b| {
            use std::fmt::Write as _;
            write!(s, "{b:02x}").expect("writing to a String cannot fail");
            s
        });
        let want = std::path::Path::new("/r/streams")
            .join(&hex[..2])
            .join(&hex);
        assert_eq!(super::stream_dir(std::path::Path::new("/r"), "a/b"), want);
    }
}
