//! `govc lsp` driven over stdio with real LSP messages, as an editor does:
//! initialize, open documents, ask for definitions, hovers, completions and
//! formatting, and read the diagnostics it publishes.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};

/// A running `govc lsp` and the two ends of its stdio.
struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: i64,
    /// Notifications read while waiting for a response.
    notes: Vec<Value>,
}

impl Client {
    /// Starts the server and does the `initialize` handshake, offering
    /// `encoding` for positions.
    fn start(encoding: &str) -> (Client, Value) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_govc"))
            .args(["lsp", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut client = Client {
            child,
            stdin,
            stdout,
            next_id: 0,
            notes: Vec::new(),
        };
        let init = client.request(
            "initialize",
            json!({
                "processId": null,
                "rootUri": null,
                "capabilities": { "general": { "positionEncodings": [encoding] } },
            }),
        );
        client.notify("initialized", json!({}));
        (client, init)
    }

    fn send(&mut self, message: &Value) {
        let body = message.to_string();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        self.stdin.flush().unwrap();
    }

    fn read(&mut self) -> Value {
        let mut length = None;
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "server closed stdout"
            );
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(n) = line.strip_prefix("Content-Length: ") {
                length = Some(n.parse::<usize>().unwrap());
            }
        }
        let mut body = vec![0; length.expect("a Content-Length header")];
        self.stdout.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }));
        loop {
            let message = self.read();
            if message["id"] == id {
                assert!(message.get("error").is_none(), "{method}: {message}");
                return message["result"].clone();
            }
            self.notes.push(message);
        }
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({ "jsonrpc": "2.0", "method": method, "params": params }));
    }

    /// The next `publishDiagnostics` for `uri`.
    fn diagnostics(&mut self, uri: &str) -> Vec<Value> {
        loop {
            let note = match self.notes.iter().position(|n| {
                n["method"] == "textDocument/publishDiagnostics" && n["params"]["uri"] == uri
            }) {
                Some(i) => self.notes.remove(i),
                None => self.read(),
            };
            if note["method"] == "textDocument/publishDiagnostics" && note["params"]["uri"] == uri {
                return note["params"]["diagnostics"].as_array().unwrap().clone();
            }
            self.notes.push(note);
        }
    }

    fn open(&mut self, uri: &str, text: &str) -> Vec<Value> {
        self.notify(
            "textDocument/didOpen",
            json!({ "textDocument": { "uri": uri, "languageId": "gov", "version": 1, "text": text } }),
        );
        self.diagnostics(uri)
    }

    /// `shutdown`, then `exit`: the server ends with status 0.
    fn stop(mut self) {
        let result = self.request("shutdown", Value::Null);
        assert_eq!(result, Value::Null);
        self.notify("exit", Value::Null);
        // Bounded: a server that ignores `exit` fails the test instead of hanging it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("govc lsp did not exit within 10 s of `exit`");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert!(status.success(), "{status}");
    }
}

/// A test that fails half way does not leave the server running.
impl Drop for Client {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn at(line: u32, character: u32) -> Value {
    json!({ "line": line, "character": character })
}

const POLICY: &str = "registry eureka {\n  server_cache 30s\n  client_refresh 30s\n  balancer_refresh 30s\n}\n\nservice order {\n  registry eureka\n  capacity workers 4\n  match slow = path prefix \"/slow\"\n  bulkhead b on slow {\n    max_concurrent 8\n  }\n  shutdown {\n    deregister\n    wait for eureka\n    drain 5s\n  }\n}\n";

#[test]
fn diagnostics_are_published_as_you_type() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}/order.gov", dir.path().display());
    let (mut client, init) = Client::start("utf-16");
    let caps = &init["capabilities"];
    assert_eq!(caps["positionEncoding"], "utf-16");
    assert_eq!(caps["definitionProvider"], true);
    assert_eq!(caps["hoverProvider"], true);
    assert_eq!(caps["documentFormattingProvider"], true);

    // A lint: its range is the primary label (`8`, line 12), its context
    // (`capacity workers 4`) related information.
    let diagnostics = client.open(&uri, POLICY);
    assert_eq!(diagnostics.len(), 1, "{diagnostics:#?}");
    let d = &diagnostics[0];
    assert_eq!(d["code"], "gov::lint::bulkhead-over-workers");
    assert_eq!(d["severity"], 2);
    assert_eq!(d["range"]["start"], at(11, 19));
    assert_eq!(d["range"]["end"], at(11, 20));
    assert!(d["message"].as_str().unwrap().contains("\nhelp: "), "{d}");
    assert_eq!(
        d["relatedInformation"][0]["location"]["range"]["start"],
        at(8, 19)
    );

    // A syntax error and a semantic error in one edit; the column of `x`
    // counts UTF-16 units after a non-ASCII string.
    let broken = "service order {\n  domain \"café\"  capacity workers x\n  bulkhead b on nowhere { max_concurrent 1 }\n}\n";
    client.notify(
        "textDocument/didChange",
        json!({
            "textDocument": { "uri": uri, "version": 2 },
            "contentChanges": [{ "text": broken }],
        }),
    );
    let diagnostics = client.diagnostics(&uri);
    let codes: Vec<&str> = diagnostics
        .iter()
        .map(|d| d["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        ["gov::syntax", "gov::unknown-match"],
        "{diagnostics:#?}"
    );
    assert_eq!(diagnostics[0]["range"]["start"], at(1, 34));
    assert_eq!(diagnostics[0]["severity"], 1);

    // Closing the document clears its diagnostics.
    client.notify(
        "textDocument/didClose",
        json!({ "textDocument": { "uri": uri } }),
    );
    assert!(client.diagnostics(&uri).is_empty());
    client.stop();
}

#[test]
fn a_service_defined_in_a_sibling_file_is_not_unknown() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("inventory.gov"), "service inventory {}\n").unwrap();
    let uri = format!("file://{}/order.gov", dir.path().display());
    let (mut client, _) = Client::start("utf-8");
    let text = "service order {\n  bulkhead b on calls to inventory { max_concurrent 1 }\n  bulkhead c on calls to stock { max_concurrent 1 }\n}\n";
    let diagnostics = client.open(&uri, text);
    let codes: Vec<&str> = diagnostics
        .iter()
        .map(|d| d["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["gov::unknown-service"], "{diagnostics:#?}");
    assert_eq!(diagnostics[0]["range"]["start"], at(2, 25));
    client.stop();
}

#[test]
fn definition_hover_completion_and_formatting() {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("file://{}/order.gov", dir.path().display());
    let (mut client, _) = Client::start("utf-8");
    client.open(&uri, POLICY);
    let doc = json!({ "uri": uri });

    // `slow` in `bulkhead b on slow` (line 10) goes to `match slow` (line 9).
    let def = client.request(
        "textDocument/definition",
        json!({ "textDocument": doc, "position": at(10, 17) }),
    );
    assert_eq!(def["uri"], uri.as_str());
    assert_eq!(def["range"]["start"], at(9, 8));
    assert_eq!(def["range"]["end"], at(9, 12));

    // `eureka` in `wait for eureka` (line 15) goes to the registry.
    let def = client.request(
        "textDocument/definition",
        json!({ "textDocument": doc, "position": at(15, 15) }),
    );
    assert_eq!(def["range"]["start"], at(0, 9));

    let hover = client.request(
        "textDocument/hover",
        json!({ "textDocument": doc, "position": at(15, 15) }),
    );
    let value = hover["contents"]["value"].as_str().unwrap();
    assert!(value.contains("registry eureka {"), "{value}");
    assert!(value.contains("waits 90s"), "{value}");
    let hover = client.request(
        "textDocument/hover",
        json!({ "textDocument": doc, "position": at(10, 17) }),
    );
    let value = hover["contents"]["value"].as_str().unwrap();
    assert!(
        value.contains("match slow = path prefix \"/slow\""),
        "{value}"
    );

    // Nothing to find on a keyword.
    let none = client.request(
        "textDocument/definition",
        json!({ "textDocument": doc, "position": at(8, 3) }),
    );
    assert_eq!(none, Value::Null);

    let completion = client.request(
        "textDocument/completion",
        json!({ "textDocument": doc, "position": at(12, 2) }),
    );
    let labels: Vec<&str> = completion
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    for word in ["bulkhead", "max_concurrent", "wait", "slow"] {
        assert!(labels.contains(&word), "{word} missing from {labels:?}");
    }

    // Formatting: one edit with `govc fmt`'s layout.
    let messy = "service  order{capacity workers 4}";
    client.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 2 }, "contentChanges": [{ "text": messy }] }),
    );
    let edits = client.request(
        "textDocument/formatting",
        json!({ "textDocument": doc, "options": { "tabSize": 2, "insertSpaces": true } }),
    );
    assert_eq!(
        edits[0]["newText"],
        "service order {\n  capacity workers 4\n}\n"
    );
    assert_eq!(edits[0]["range"]["end"], at(0, 34));
    // A document with syntax errors is left alone.
    client.notify(
        "textDocument/didChange",
        json!({ "textDocument": { "uri": uri, "version": 3 }, "contentChanges": [{ "text": "service {" }] }),
    );
    let edits = client.request(
        "textDocument/formatting",
        json!({ "textDocument": doc, "options": { "tabSize": 2, "insertSpaces": true } }),
    );
    assert_eq!(edits, Value::Null);
    client.stop();
}
