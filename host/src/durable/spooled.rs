//! Bytes that may be too large to hold in memory on their way to a file devplug keeps.

/// Bytes on their way to a file devplug keeps: in memory, or in an unnamed file of devplug's
/// own directory (a download of tens of MB, never held whole in memory before it is kept).
pub enum Spooled {
    Bytes(Vec<u8>),
    File(std::fs::File),
}

impl Spooled {
    /// Write it all into `out` (the file it is kept in).
    pub fn write_into(self, out: &mut std::fs::File) -> std::io::Result<()> {
        use std::io::{Seek, Write};
        match self {
            Spooled::Bytes(b) => out.write_all(&b),
            Spooled::File(mut f) => {
                f.seek(std::io::SeekFrom::Start(0))?;
                std::io::copy(&mut f, out).map(drop)
            }
        }
    }

    /// All of it in memory (where there is nowhere to keep it).
    pub fn into_bytes(self) -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Seek};
        match self {
            Spooled::Bytes(b) => Ok(b),
            Spooled::File(mut f) => {
                f.seek(std::io::SeekFrom::Start(0))?;
                let mut b = Vec::new();
                f.read_to_end(&mut b)?;
                Ok(b)
            }
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Spooled::Bytes(b) => b.len() as u64,
            Spooled::File(f) => f.metadata().map(|m| m.len()).unwrap_or(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spooled file is read from its start wherever its writer left the offset.
    #[test]
    fn a_spooled_file_reads_whole_from_its_start() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"native code").unwrap();
        let spooled = Spooled::File(f);
        assert_eq!(spooled.len(), 11);
        let mut out = tempfile::tempfile().unwrap();
        spooled.write_into(&mut out).unwrap();
        assert_eq!(Spooled::File(out).into_bytes().unwrap(), b"native code");
        assert!(Spooled::Bytes(Vec::new()).is_empty());
    }
}
