//! The vendor guide's code blocks, which the suite runs as written.

/// The first ```` ```LANG ```` block after heading `section` of docs/writing-a-backend.md.
pub fn block(section: &str, lang: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/writing-a-backend.md");
    let guide = std::fs::read_to_string(&path).expect("the vendor guide");
    let at = guide.find(section).unwrap_or_else(|| panic!("no {section:?} in the guide"));
    let fence = format!("```{lang}\n");
    let block = &guide[at..];
    let block = &block[block.find(&fence).expect("the section's block") + fence.len()..];
    block[..block.find("```").expect("the block's end")].to_owned()
}
