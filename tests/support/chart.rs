//! The Helm chart as a cluster gets it: `helm template` (the helm `./scripts/test` installs)
//! rendered to JSON objects, and what its DRA objects grant, for the API-server stand-in (RBAC
//! rules and the slice policy's effect) and a real kube-apiserver (the objects themselves).

use std::path::PathBuf;

use devplug_standins::apiserver::authz::{Rule, SlicePolicy};
use serde_json::Value;

/// A tool the suite's setup (`./scripts/test`) installs; a test that needs it fails loudly
/// without it rather than passing.
pub fn tool(name: &str) -> PathBuf {
    let installed = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/devplug-tools/bin"));
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(installed)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` is not on PATH: run the suite with ./scripts/test, which installs it"))
}

pub fn repo() -> PathBuf {
    super::paths::repo()
}

/// `helm template devplug deploy/helm/devplug --namespace devplug --set S…` as YAML text.
pub fn template(sets: &[&str]) -> String {
    let mut cmd = std::process::Command::new(tool("helm"));
    cmd.args(["template", "devplug"]).arg(repo().join("deploy/helm/devplug")).args(["--namespace", "devplug"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run helm");
    assert!(out.status.success(), "helm template {sets:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("helm writes UTF-8")
}

/// The objects of a multi-document YAML text, as JSON.
pub fn objects(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| serde::Deserialize::deserialize(doc).expect("YAML helm rendered"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The chart rendered with these `--set`s, as objects.
pub fn render(sets: &[&str]) -> Vec<Value> {
    objects(&template(sets))
}

/// The one object of `kind` (named `name`, when given).
pub fn find<'a>(objects: &'a [Value], kind: &str, name: Option<&str>) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && name.is_none_or(|n| o["metadata"]["name"] == n))
        .unwrap_or_else(|| panic!("the chart rendered no {kind} {name:?}"))
}

/// The chart's DRA ServiceAccount is `devplug/devplug`; the rules its ClusterRole grants it.
pub fn rbac_rules(objects: &[Value]) -> Vec<Rule> {
    serde_json::from_value(find(objects, "ClusterRole", Some("devplug-dra"))["rules"].clone()).expect("PolicyRules")
}

/// What the chart's ValidatingAdmissionPolicy enforces, as the stand-in models its effect:
/// its name, the user its match condition names, and the drivers its `drivers` variable lists.
pub fn slice_policy(objects: &[Value]) -> SlicePolicy {
    let vap = find(objects, "ValidatingAdmissionPolicy", None);
    let condition = vap["spec"]["matchConditions"][0]["expression"].as_str().expect("a match condition");
    let username = condition.split('"').nth(1).expect("request.userInfo.username == \"…\"").to_owned();
    let drivers = vap["spec"]["variables"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "drivers")
        .and_then(|v| v["expression"].as_str())
        .expect("a drivers variable");
    let drivers: Vec<String> = serde_json::from_str(drivers).expect("the drivers variable is a list of strings");
    let binding = find(objects, "ValidatingAdmissionPolicyBinding", None);
    assert_eq!(binding["spec"]["policyName"], vap["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]), "the binding denies");
    SlicePolicy { name: vap["metadata"]["name"].as_str().unwrap_or_default().to_owned(), username, drivers }
}

/// The stand-in holds ServiceAccounts to what the chart rendered with `sets` grants, and to its
/// slice policy; returns a token of the chart's ServiceAccount bound to a Pod on `node`.
pub fn least_privilege(api: &devplug_standins::apiserver::ApiServer, sets: &[&str], node: &str) -> String {
    let objects = render(sets);
    api.grant(rbac_rules(&objects));
    api.enforce(slice_policy(&objects));
    api.service_account_token("devplug", "devplug", Some(node))
}
