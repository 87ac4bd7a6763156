//! The vendor guide's code blocks, which the suite runs as written.

/// The first ```` ```LANG ```` block after heading `section` of docs/writing-a-backend.md.
pub fn block(section: &str, lang: &str) -> String {
    let path = super::paths::repo().join("docs/writing-a-backend.md");
    let guide = std::fs::read_to_string(&path).expect("the vendor guide");
    let at = guide.find(section).unwrap_or_else(|| panic!("no {section:?} in the guide"));
    let fence = format!("```{lang}\n");
    let block = &guide[at..];
    let block = &block[block.find(&fence).expect("the section's block") + fence.len()..];
    block[..block.find("```").expect("the block's end")].to_owned()
}

/// The `try` and `run` lines of the guide's two-terminal block under `section`, made the test's:
/// `/tmp/k` under `work`, the backends dir `try` the chaos backend copied to `work/backends`,
/// the fixture tree `m`, then each of `more` (guide text → test text).
pub fn try_and_run(
    section: &str,
    work: &std::path::Path,
    m: &super::fixtures::Machine,
    more: &[(&str, &str)],
) -> (String, String) {
    let block = block(section, "sh");
    let lines: Vec<&str> = block.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 2, "{block}");
    let (wasm, manifest) = super::daemon::chaos_paths();
    let backends = work.join("backends");
    std::fs::create_dir_all(&backends).expect("backends dir");
    std::fs::copy(&wasm, backends.join("chaos.wasm")).expect("copy chaos.wasm");
    std::fs::copy(&manifest, backends.join("chaos.toml")).expect("copy chaos.toml");
    let ours = |l: &str| {
        let mut l = l
            .replace("/tmp/k", &work.join("k").display().to_string())
            .replace("--backends-dir try", &format!("--backends-dir {}", backends.display()))
            .replace("tests/fixture/sys", &m.sys().display().to_string())
            .replace("tests/fixture/dev", &m.dev().display().to_string());
        for (from, to) in more {
            l = l.replace(from, to);
        }
        l
    };
    (ours(lines[0]), ours(lines[1]))
}
