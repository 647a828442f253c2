//! `pdsim serve` as a client sees it: streamed and whole completions, usage,
//! vLLM's 400 for a prompt over the model length, `/metrics`, and a
//! `--record` trace that `pdsim run` replays to the times the server
//! reported. A tiny HTTP/1.1 client on `TcpStream` (no dependency); no
//! timing is asserted, only simulated times, which do not depend on the
//! machine's speed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use super::common::{fixture, pdsim, root, scratch};

/// A running server, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    /// `pdsim serve tests/fixtures/serve.toml --port 0 --speed 50 [extra]`,
    /// its address read from the first line it prints.
    fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pdsim"))
            .args(["serve", fixture("serve.toml").to_str().unwrap(), "--port", "0", "--speed", "50"])
            .args(extra)
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().rsplit("http://").next().unwrap().to_owned();
        assert!(line.starts_with("pdsim serve: listening on http://"), "{line}");
        Server { child, addr }
    }

    /// One request; returns the status and the body (de-chunked).
    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
        self.request_with(method, path, body, "")
    }

    /// One request with `headers` (lines ending in CRLF) besides the usual.
    fn request_with(&self, method: &str, path: &str, body: Option<&Value>, headers: &str) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             {headers}Connection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8(raw).unwrap();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
        (status, if chunked { dechunk(rest) } else { rest.to_owned() })
    }

    fn post(&self, path: &str, body: Value) -> (u16, String) {
        self.request("POST", path, Some(&body))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
}

/// The JSON of each `data:` event of a stream, and whether it ended with
/// `data: [DONE]`.
fn events(body: &str) -> (Vec<Value>, bool) {
    let mut out = Vec::new();
    let mut done = false;
    for event in body.split("\n\n").filter(|e| !e.is_empty()) {
        let data = event.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data line: {event:?}"));
        assert!(!done, "nothing after [DONE]");
        if data == "[DONE]" {
            done = true;
        } else {
            out.push(serde_json::from_str(data).unwrap());
        }
    }
    (out, done)
}

/// The value of a metric line (its name and labels as written).
fn metric(text: &str, name: &str) -> f64 {
    let line = text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with('{')).unwrap_or_else(|| {
        panic!("no {name} in {text}");
    });
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn serve_streams_completions_as_vllm_and_counts_them() {
    let server = Server::start(&[]);
    assert_eq!(server.request("GET", "/health", None).0, 200);
    let (status, models) = server.request("GET", "/v1/models", None);
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "serve-test");
    assert_eq!(models["data"][0]["max_model_len"], 4096);

    // A streamed completion: 7 tokens, the last with its finish reason,
    // then the usage chunk and [DONE]. "Hello, pdsim!" is 13 characters:
    // ⌈13 / 4⌉ = 4 prompt tokens.
    let (status, body) = server.post(
        "/v1/completions",
        json!({"model": "any", "prompt": "Hello, pdsim!", "max_tokens": 7, "stream": true,
            "stream_options": {"include_usage": true}}),
    );
    assert_eq!(status, 200, "{body}");
    let (chunks, done) = events(&body);
    assert!(done, "the stream ends with [DONE]: {body}");
    let tokens: Vec<&Value> = chunks.iter().filter(|c| !c["choices"].as_array().unwrap().is_empty()).collect();
    assert_eq!(tokens.len(), 7);
    assert!(tokens[..6].iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
    assert_eq!(tokens[6]["choices"][0]["finish_reason"], "length");
    assert_eq!(tokens[0]["object"], "text_completion");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage,
        &json!({"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11,
        "prompt_tokens_details": null})
    );

    // A streamed chat: the role chunk, then 5 tokens; no usage chunk unasked.
    // Prompt: ⌈8 / 4⌉ = 2, plus 4 for the message, plus 3 for the reply: 9.
    let (_, body) = server.post(
        "/v1/chat/completions",
        json!({"model": "any", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 5,
            "stream": true}),
    );
    let (chunks, done) = events(&body);
    assert!(done);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content = chunks.iter().filter(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(content.count(), 5);
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));

    // Whole: prompt_token_ids give the prompt's length.
    let (status, body) = server.post(
        "/v1/completions",
        json!({"model": "any", "prompt_token_ids": vec![1; 300], "max_tokens": 3, "min_tokens": 3,
            "ignore_eos": true}),
    );
    assert_eq!(status, 200, "{body}");
    let whole: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(whole["usage"]["prompt_tokens"], 300);
    assert_eq!(whole["usage"]["completion_tokens"], 3);
    assert_eq!(whole["choices"][0]["text"], " lorem ipsum dolor");

    // A prompt of the model length is refused, with vLLM's error body.
    let (status, body) = server.post("/v1/completions", json!({"model": "any", "prompt_token_ids": vec![1; 4096]}));
    assert_eq!(status, 400);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["object"], "error");
    assert_eq!(error["type"], "BadRequestError");
    assert_eq!(error["code"], 400);
    assert!(error["param"].is_null());
    assert!(error["message"].as_str().unwrap().contains("maximum context length is 4096 tokens"), "{error}");

    // The counters: 3 requests done, 4 + 9 + 300 prompt tokens, 7 + 5 + 3
    // output tokens, one refused; nothing in flight.
    let (status, text) = server.request("GET", "/metrics", None);
    assert_eq!(status, 200);
    assert_eq!(metric(&text, "vllm:request_success_total"), 3.0);
    assert_eq!(metric(&text, "vllm:prompt_tokens_total"), 313.0);
    assert_eq!(metric(&text, "vllm:generation_tokens_total"), 15.0);
    assert_eq!(metric(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(metric(&text, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(metric(&text, "pdsim:request_refused_total"), 1.0);
    assert_eq!(metric(&text, "vllm:time_to_first_token_seconds_count"), 3.0);
    // One gap per token after the first: 6 + 4 + 2.
    assert_eq!(metric(&text, "vllm:inter_token_latency_seconds_count"), 12.0);
    assert_eq!(metric(&text, "vllm:e2e_request_latency_seconds_count"), 3.0);
    assert!(text.contains("# TYPE vllm:kv_cache_usage_perc gauge"));
}

/// Requests served, some at once, are recorded; `pdsim run` on the record
/// gives each the TTFT and E2E the server reported, to the nanosecond.
/// Priorities reach the record: vLLM's `X-Vllm-Priority` header (on every
/// third request) in the body's place, and the body's where the header is
/// no integer.
#[test]
fn a_record_replays_to_the_times_the_server_reported() {
    let record = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pdsim-it").join("serve-record.jsonl");
    std::fs::create_dir_all(record.parent().unwrap()).unwrap();
    let server = Server::start(&["--record", record.to_str().unwrap()]);
    let reported: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12u64)
            .map(|i| {
                let server = &server;
                s.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(i * 7));
                    let body = json!({"model": "any", "prompt_token_ids": vec![1; 200 + 150 * i as usize],
                        "max_tokens": 20 + 5 * i, "stream": i % 2 == 0,
                        "stream_options": {"include_usage": true}, "priority": if i == 1 { 5 } else { 0 }});
                    let header = match i {
                        1 => "X-Vllm-Priority: high\r\n",
                        _ if i % 3 == 0 => "X-Vllm-Priority: 2\r\n",
                        _ => "",
                    };
                    let (status, body) = server.request_with("POST", "/v1/completions", Some(&body), header);
                    assert_eq!(status, 200, "{body}");
                    if i % 2 == 0 {
                        let (chunks, done) = events(&body);
                        assert!(done);
                        chunks.last().unwrap()["pdsim"].clone()
                    } else {
                        serde_json::from_str::<Value>(&body).unwrap()["pdsim"].clone()
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop(server);
    let rows = std::fs::read_to_string(&record).unwrap();
    assert_eq!(rows.lines().count(), 12);
    let with = |p: &str| rows.lines().filter(|r| r.contains(&format!("\"priority\": {p}}}"))).count();
    assert_eq!((with("2"), with("5")), (4, 1), "{rows}");
    let replay = scratch(
        "serve-replay.toml",
        &format!(
            "include = [{:?}]\n[workload]\ntrace = {{ format = \"mooncake\", path = {:?} }}\n",
            fixture("serve.toml").to_str().unwrap(),
            record.to_str().unwrap()
        ),
    );
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pdsim-it").join("serve-replay");
    let run = pdsim(&["run", replay.to_str().unwrap(), "--out", out.to_str().unwrap(), "-q", "--no-trace"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let csv = std::fs::read_to_string(out.join("requests.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (id, ttft, e2e) = (col("id"), col("ttft_ms"), col("e2e_ms"));
    let mut seen = 0;
    for line in csv.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let r = reported
            .iter()
            .find(|r| r["request_id"].as_u64() == f[id].parse().ok())
            .expect("a request the server served");
        let ns = |k: &str| r[k].as_u64().unwrap();
        // requests.csv has milliseconds to six decimals: nanoseconds.
        let ms = |ns: u64| format!("{}.{:06}", ns / 1_000_000, ns % 1_000_000);
        assert_eq!(f[ttft], ms(ns("first_token_ns") - ns("arrival_ns")), "request {}: TTFT", f[id]);
        assert_eq!(f[e2e], ms(ns("finished_ns") - ns("arrival_ns")), "request {}: E2E", f[id]);
        seen += 1;
    }
    assert_eq!(seen, 12);
}

/// Bad input exits 2 with one line, before anything is bound.
#[test]
fn serve_refuses_bad_input_with_one_line() {
    let missing = pdsim(&["serve", "tests/fixtures/no-such-scenario.toml", "--port", "0"]);
    let slow = pdsim(&["serve", fixture("serve.toml").to_str().unwrap(), "--port", "0", "--speed", "0"]);
    for out in [missing, slow] {
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(out.stdout.is_empty(), "nothing was bound");
    }
}
