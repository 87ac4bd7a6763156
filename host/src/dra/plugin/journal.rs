//! An append-only log of JSON records, one per line, for the claim checkpoint: a batch of
//! records is one `write`, and no flush. What it must survive is devplug dying (a crash, a
//! SIGKILL, a rolling update), after which the kernel still holds every write in order; a power
//! cut or a kernel crash is a reboot, after which the checkpoint answers nothing from an earlier
//! boot anyway (`checkpoint.rs`), so an `fdatasync` would buy no answer and cost every prepare
//! and unprepare a disk flush (0.65 ms at p50, 3 ms at p90 on a loaded node:
//! docs/BENCHMARKS.md). Replay reads every whole line; a line cut short by a crash mid-append is
//! dropped and cut off the file, so the next append starts on a clean line.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::sync::Locked;

/// The log at one path.
pub struct Journal {
    path: PathBuf,
    /// The file, how many records it holds, and how many appends this log has made.
    file: Mutex<(File, usize, u64)>,
}

/// What [`Journal::open`] read: each whole line's JSON, and what could not be read.
pub struct Replayed {
    pub records: Vec<serde_json::Value>,
    pub problems: Vec<String>,
}

impl Journal {
    /// Open (or create, `0600`) the log `name` in `dir` and read it back; a link or anything
    /// but a regular file of devplug's there is refused, never opened.
    pub fn open(dir: &crate::durable::StateDir, name: &str) -> std::io::Result<(Journal, Replayed)> {
        let path = dir.shown(name);
        let path = path.as_path();
        let (mut file, _) = dir.open_append(name)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut records = Vec::new();
        let mut problems = Vec::new();
        // Everything up to the last newline is whole lines; anything after it was cut short.
        let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        for (n, line) in bytes[..whole].split(|b| *b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice(line) {
                Ok(v) => records.push(v),
                Err(e) => problems.push(format!("{} line {}: {e}", path.display(), n + 1)),
            }
        }
        if whole < bytes.len() {
            problems.push(format!(
                "{}: the last {} bytes are a record cut short (a crash while it was written); dropped",
                path.display(),
                bytes.len() - whole
            ));
            file.set_len(whole as u64)?;
            file.seek(SeekFrom::End(0))?;
            crate::durable::sync_data(&file)?;
        }
        let lines = records.len() + problems.len();
        Ok((Journal { path: path.to_owned(), file: Mutex::new((file, lines, 0)) }, Replayed { records, problems }))
    }

    /// Append `records` as one write (in the kernel before this returns; not flushed).
    pub fn append<T: serde::Serialize>(&self, records: &[T]) -> std::io::Result<()> {
        let mut buf = Vec::new();
        for r in records {
            serde_json::to_writer(&mut buf, r).map_err(std::io::Error::other)?;
            buf.push(b'\n');
        }
        let mut f = self.file.locked();
        f.0.write_all(&buf)?;
        f.1 += records.len();
        f.2 += 1;
        Ok(())
    }

    /// Appends (each one `write`) this log has made since it was opened.
    pub fn appends(&self) -> u64 {
        self.file.locked().2
    }

    /// Records in the log.
    pub fn lines(&self) -> usize {
        self.file.locked().1
    }

    /// Empty the log (its records are in a snapshot now).
    pub fn reset(&self) -> std::io::Result<()> {
        let mut f = self.file.locked();
        f.0.set_len(0)?;
        f.0.seek(SeekFrom::Start(0))?;
        f.1 = 0;
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_one_write_and_a_torn_tail_is_cut_off() {
        let d = tempfile::tempdir().unwrap();
        let dir = crate::durable::StateDir::open(&d.path().join("s")).unwrap();
        let p = d.path().join("s/j");
        let (j, r) = Journal::open(&dir, "j").unwrap();
        assert!(r.records.is_empty() && r.problems.is_empty());
        j.append(&[serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]).unwrap();
        assert_eq!(j.appends(), 1, "one batch, one write");
        drop(j);
        // A crash mid-append leaves half a line.
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(br#"{"c": 3"#).unwrap();
        drop(f);
        let (j, r) = Journal::open(&dir, "j").unwrap();
        assert_eq!(r.records.len(), 2);
        assert!(r.problems[0].contains("cut short"), "{:?}", r.problems);
        j.append(&[serde_json::json!({"d": 4})]).unwrap();
        drop(j);
        let (_, r) = Journal::open(&dir, "j").unwrap();
        assert_eq!(r.records.len(), 3, "the next record starts on a clean line");
        assert!(r.problems.is_empty(), "{:?}", r.problems);
    }
}
