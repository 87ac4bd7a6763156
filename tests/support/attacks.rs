//! The claim-file attacks of issue 49, for `devplug try` over the chaos backend's pool (its
//! class `widget.test.devplug.io`): the test asserts each ends in its error, the floods bench
//! times them. Each is (what it is, the file's text, what the error must say).

/// A ResourceClaim `name` with one request `r` of the chaos class: `request` is more of the
/// request's lines, `rest` lines after the requests (constraints).
pub fn claim(name: &str, request: &str, rest: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}\nspec:\n  devices:\n    requests:\n    - name: r\n      exactly:\n        deviceClassName: widget.test.devplug.io\n{request}{rest}"
    )
}

/// A request's `selectors` of one CEL expression.
fn selector(expression: &str) -> String {
    format!("        selectors:\n        - cel:\n            expression: '{expression}'\n")
}

/// The six attacks; the alias file padded with copies of its last alias to `alias_bytes`.
pub fn claim_files(alias_bytes: usize) -> Vec<(&'static str, String, &'static str)> {
    // Ten levels of ten aliases each: 10^10 values once expanded.
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        bomb.push_str(&format!("a{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 10].join(", ")));
    }
    while bomb.len() < alias_bytes {
        bomb.push_str(&format!("b{}: [*a9, *a9, *a9, *a9, *a9, *a9, *a9, *a9]\n", bomb.len()));
    }
    let list = format!("[{}]", vec!["0"; 1000].join(","));
    let nested = format!("cel.bind(l, {list}, l.all(a, l.all(b, l.all(c, a + b + c >= 0))))");
    let mut chain = "cel.bind(a0, \"xxxxxxxx\", ".to_owned();
    for i in 1..28 {
        chain.push_str(&format!("cel.bind(a{i}, a{} + a{}, ", i - 1, i - 1));
    }
    chain.push_str(&format!("size(a27) > 0{}", ")".repeat(28)));
    // Issue 58: the same chain with each step inside a conditional (once priced as small).
    let mut hidden = "cel.bind(a0, \"xxxxxxxx\", ".to_owned();
    for i in 1..28 {
        hidden.push_str(&format!("cel.bind(a{i}, (true ? a{} + a{} : \"\"), ", i - 1, i - 1));
    }
    hidden.push_str(&format!("size(a27) > 0{}", ")".repeat(28)));
    // Admitted by the estimate (27,000 steps a device), but milliseconds a run, and false on
    // every device: the search's deadline must hold while selectors run.
    let thirty = format!("[{}]", vec!["0"; 30].join(","));
    let admitted = format!(
        "cel.bind(l, {thirty}, l.all(a, l.all(b, l.all(c, a + b + c >= 0)))) && device.attributes[\"chaos.devplug.io\"].index == \"none\""
    );
    let never = claim(
        "never",
        "        count: 2\n",
        "    constraints:\n    - requests: [r]\n      matchAttribute: chaos.devplug.io/index\n",
    );
    vec![
        ("YAML aliases", bomb, "YAML aliases"),
        (
            "three nested all() over 1,000 elements",
            claim("nested", &selector(&nested), ""),
            "Forbidden: too complex, exceeds cost limit",
        ),
        (
            "a cel.bind doubling chain",
            claim("chain", &selector(&chain), ""),
            "Forbidden: too complex, exceeds cost limit",
        ),
        (
            "a cel.bind doubling chain inside conditionals",
            claim("hidden", &selector(&hidden), ""),
            "Forbidden: too complex, exceeds cost limit",
        ),
        (
            "three nested all() over 30 elements, on every device",
            claim("admitted", &selector(&admitted), ""),
            "timed out",
        ),
        ("a claim no pair of devices satisfies", never, "timed out"),
    ]
}
