//! The API-server stand-in answers every recorded ResourceSlice as the real kube-apiserver 1.36
//! answered it (tests/fixtures/k8s/resourceslice-verdicts.jsonl, see its README): the same HTTP
//! status, and for refusals the same message and the same causes' field paths. Sent over HTTP
//! with the stand-in's own token, as any client would.

use std::collections::BTreeMap;
use std::path::PathBuf;

use devplug_standins::apiserver::ApiServer;
use serde_json::Value;

/// Both recordings: the first corpus (2026-11-24) and the boundary cases a real v1.36.2 server
/// answered (`tests/dra.rs`'s `boundary_cases`, recorded with `DEVPLUG_RECORD_VERDICTS`).
fn corpus() -> Vec<Value> {
    let mut out = Vec::new();
    for file in ["resourceslice-verdicts.jsonl", "resourceslice-verdicts-boundaries.jsonl"] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/k8s").join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out.extend(text.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str::<Value>(l).unwrap()));
    }
    out
}

/// Field paths as a multiset: the server walks Go maps in random order.
fn fields(v: &Value) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for f in v.as_array().into_iter().flatten().filter_map(Value::as_str) {
        *out.entry(f.to_owned()).or_default() += 1;
    }
    out
}

#[tokio::test]
async fn every_recorded_slice_gets_the_recorded_answer() {
    let api = ApiServer::start(&["node-a"]).await;
    let cases = corpus();
    assert!(cases.len() >= 100, "only {} cases", cases.len());
    let mut wrong = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let (code, answer) = api.post("/apis/resource.k8s.io/v1/resourceslices", &case["object"]).await;
        let want = case["status"].as_u64().unwrap() as u16;
        if code != want {
            wrong.push(format!("{name}: answered {code}, the server {want}: {}", answer["message"]));
            continue;
        }
        if case["accepted"] == true {
            continue;
        }
        if answer["message"] != case["message"] {
            wrong.push(format!("{name}:\n  stand-in: {}\n  server:   {}", answer["message"], case["message"]));
        }
        let got: Vec<Value> =
            answer["details"]["causes"].as_array().into_iter().flatten().map(|c| c["field"].clone()).collect();
        if fields(&Value::Array(got.clone())) != fields(&case["fields"]) {
            wrong.push(format!("{name}: causes {got:?}, the server's {}", case["fields"]));
        }
    }
    assert!(wrong.is_empty(), "{} of {} cases answered otherwise:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
}

#[tokio::test]
async fn a_request_without_the_stand_ins_own_token_is_refused() {
    let api = ApiServer::start(&["node-a"]).await;
    let other = ApiServer::start(&["node-a"]).await;
    assert_ne!(api.token(), other.token(), "each stand-in has a token of its own");
    assert!(api.token().len() >= 32);
    assert!(api.kubeconfig().contains(&api.token()));
    // The old fixed token of the tests opens nothing.
    let stream = tokio::net::TcpStream::connect(api.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get("/api/v1/nodes/node-a")
        .header("host", api.addr.to_string())
        .header("authorization", "Bearer devplug-test-token")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}
