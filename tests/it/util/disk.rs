//! A small disk the test can fill: a tmpfs mounted on a fresh directory.

use std::path::Path;

use super::{fixture, skip_or_fail, Broker, GatewayConfig};

/// [`fixture`] with the store on a 16 MiB disk the test can fill; `None` (skipped, or
/// failed where required, see [`skip_or_fail`]) without the right to mount one.
pub async fn fixture_on_small_disk() -> Option<(SmallDisk, tempfile::TempDir, Broker, GatewayConfig)>
{
    let Some(disk) = SmallDisk::mount("16m") else {
        skip_or_fail("cannot mount a tmpfs to fill (needs root)");
        return None;
    };
    let (dir, broker, mut cfg) = fixture().await;
    cfg.store = disk.path().join("store");
    Some((disk, dir, broker, cfg))
}

/// A tmpfs mounted on a fresh directory, unmounted when dropped: a disk the test can fill.
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts a tmpfs of `size` (e.g. `16m`); `None` without the right to mount (not root).
    pub fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then_some(Self { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the disk has no room left.
    pub fn fill(&self) {
        use std::io::Write;
        let mut filler = std::fs::File::create(self.path().join("filler")).expect("filler");
        let block = vec![0u8; 64 * 1024];
        loop {
            match filler.write(&block) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => return, // ENOSPC
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
    }

    pub fn free(&self) {
        std::fs::remove_file(self.path().join("filler")).expect("remove filler");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
