//! The OpenAI-compatible request and response bodies, as vLLM's server
//! reads and writes them: a request's token counts (the prompt-length rule),
//! and the JSON of completions, chat completions, their streamed chunks,
//! usage and errors.

use serde::Deserialize;
use serde_json::{Value, json};

/// Characters per token when the prompt is text: a common rule of thumb for
/// English with BPE tokenizers (OpenAI's "about 4 characters a token").
pub const CHARS_PER_TOKEN: u64 = 4;

/// Template tokens per chat message (role and separators), and once for
/// the reply's opening: the overhead OpenAI's cookbook counts for its chat
/// format (3 per message plus 3 for the reply), rounded up to 4 per message
/// for the longer templates of open models (Llama 3's header is 4 to 5).
pub const CHAT_TOKENS_PER_MESSAGE: u64 = 4;
/// See [`CHAT_TOKENS_PER_MESSAGE`].
pub const CHAT_REPLY_TOKENS: u64 = 3;

/// vLLM's default `max_tokens` of a completion (`CompletionRequest`: 16);
/// a chat completion's default is what the model length leaves.
pub const COMPLETION_DEFAULT_MAX_TOKENS: u64 = 16;

/// The default output of a chat completion when the deployment has no
/// `max_model_len` (vLLM always has one: the model's context).
pub const UNLIMITED_DEFAULT_MAX_TOKENS: u64 = 4096;

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/completions`.
    Completion,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// The fields of a request body that pdsim reads (every other is ignored).
#[derive(Debug, Default, Deserialize)]
pub struct Body {
    /// Completions: the prompt (text, a list of token ids, or a list of one
    /// text).
    #[serde(default)]
    pub prompt: Option<Value>,
    /// Chat: the messages.
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    /// vLLM's extension: the prompt as token ids (its length is the prompt's).
    #[serde(default)]
    pub prompt_token_ids: Option<Vec<Value>>,
    /// Output tokens.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Chat's newer name for `max_tokens`.
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// At least this many output tokens (always met: the output is
    /// `max_tokens` long).
    #[serde(default)]
    pub min_tokens: Option<u64>,
    /// Accepted; the output is `max_tokens` long whatever it says.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `include_usage`: a last chunk with the usage.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Completions asked for; only 1 is served.
    #[serde(default)]
    pub n: Option<u64>,
    /// vLLM's request priority (lower first; 0 by default), followed by
    /// ranks under the priority policy and ignored under FCFS, as vLLM
    /// does.
    #[serde(default)]
    pub priority: Option<i64>,
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// A chat message: only its content's length counts.
#[derive(Debug, Deserialize)]
pub struct Message {
    /// Text, or a list of parts (`{"type": "text", "text": ...}`).
    #[serde(default)]
    pub content: Option<Value>,
}

/// A request as the simulation serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    /// Prompt tokens.
    pub prompt: u64,
    /// Output tokens: exactly this many are generated.
    pub output: u64,
    /// Streamed.
    pub stream: bool,
    /// A last chunk with the usage.
    pub include_usage: bool,
    /// Its priority.
    pub priority: i32,
}

/// A request refused, as vLLM refuses it: HTTP status and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 400 (a bad request).
    pub status: u16,
    /// The message of the error body.
    pub message: String,
}

fn bad(message: impl Into<String>) -> Refusal {
    Refusal { status: 400, message: message.into() }
}

/// Tokens of `text` by the documented rule: ⌈characters / 4⌉, at least 1.
///
/// ```
/// use pdsim::serve::openai::text_tokens;
/// assert_eq!(text_tokens("Hello, world"), 3); // 12 characters
/// assert_eq!(text_tokens(""), 1);
/// ```
pub fn text_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(CHARS_PER_TOKEN).max(1)
}

/// Characters of a message's content (text, or the text of its parts).
fn content_chars(content: &Value) -> u64 {
    match content {
        Value::String(s) => s.chars().count() as u64,
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).map(|t| t.chars().count() as u64).sum()
        }
        _ => 0,
    }
}

/// The prompt's tokens: `prompt_token_ids` when given; else a completion's
/// prompt (token ids: their count; text: [`text_tokens`]); else a chat's
/// messages: ⌈characters / 4⌉ of each message's content, plus
/// [`CHAT_TOKENS_PER_MESSAGE`] per message and [`CHAT_REPLY_TOKENS`].
fn prompt_tokens(kind: Kind, body: &Body) -> Result<u64, Refusal> {
    if let Some(ids) = &body.prompt_token_ids {
        return Ok(ids.len() as u64);
    }
    match kind {
        Kind::Completion => match &body.prompt {
            Some(Value::String(s)) => Ok(text_tokens(s)),
            Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Ok(items.len() as u64),
            Some(Value::Array(items)) if items.len() == 1 => match &items[0] {
                Value::String(s) => Ok(text_tokens(s)),
                Value::Array(ids) => Ok(ids.len() as u64),
                _ => Err(bad("prompt must be a string or a list of token ids")),
            },
            Some(Value::Array(_)) => Err(bad("pdsim serves one prompt per request")),
            _ => Err(bad("prompt must be a string or a list of token ids")),
        },
        Kind::Chat => {
            let messages = body.messages.as_deref().ok_or_else(|| bad("messages: field required"))?;
            let chars: u64 = messages.iter().map(|m| m.content.as_ref().map_or(0, content_chars)).sum();
            Ok(chars.div_ceil(CHARS_PER_TOKEN) + CHAT_TOKENS_PER_MESSAGE * messages.len() as u64 + CHAT_REPLY_TOKENS)
        }
    }
}

/// Reads a request as vLLM would: the prompt's length, the output's
/// (`max_tokens`, else vLLM's default), and refuses what vLLM refuses
/// with a 400: an empty prompt, a prompt of `max_model_len` tokens or more,
/// a prompt and `max_tokens` over `max_model_len`, `min_tokens` above
/// `max_tokens`, `n` other than 1 (pdsim serves one completion).
/// `priority_header`: the request's `X-Vllm-Priority` header, which takes
/// the body's place when it reads as an integer, as vLLM's
/// `_get_priority` (`entrypoints/generate/base/serving.py`) takes it.
pub fn read(
    kind: Kind,
    body: &Body,
    priority_header: Option<&str>,
    max_model_len: Option<u64>,
) -> Result<Ask, Refusal> {
    let prompt = prompt_tokens(kind, body)?;
    if prompt == 0 {
        return Err(bad("The prompt cannot be empty."));
    }
    if body.n.is_some_and(|n| n != 1) {
        return Err(bad("pdsim serves one completion per request (n = 1)"));
    }
    if let Some(max) = max_model_len
        && prompt >= max
    {
        // vLLM's `_validate_model_input` (and pdsim's rule: a prompt that
        // leaves no room for an output token fails at arrival).
        return Err(bad(format!(
            "This model's maximum context length is {max} tokens. However, your request has {prompt} input tokens. \
             Please reduce the length of the input messages."
        )));
    }
    let asked = body.max_tokens.or(body.max_completion_tokens);
    let output = match (asked, kind, max_model_len) {
        (Some(0), ..) => return Err(bad("max_tokens must be at least 1, got 0.")),
        (Some(n), _, Some(max)) if prompt + n > max => {
            return Err(bad(format!(
                "This model's maximum context length is {max} tokens. However, you requested {} tokens ({prompt} \
                 in the messages, {n} in the completion). Please reduce the length of the messages or completion.",
                prompt + n
            )));
        }
        (Some(n), ..) => n,
        (None, Kind::Completion, max) => {
            max.map_or(COMPLETION_DEFAULT_MAX_TOKENS, |m| COMPLETION_DEFAULT_MAX_TOKENS.min(m - prompt))
        }
        (None, Kind::Chat, Some(max)) => max - prompt,
        (None, Kind::Chat, None) => UNLIMITED_DEFAULT_MAX_TOKENS,
    };
    if let Some(min) = body.min_tokens
        && min > output
    {
        return Err(bad(format!("min_tokens ({min}) must be less than or equal to max_tokens ({output})")));
    }
    // (vLLM's priority is a Python int; pdsim's a 32-bit one.)
    let asked = priority_header.and_then(python_int).or(body.priority.map(i128::from));
    let priority = match asked.map(i32::try_from) {
        None => 0,
        Some(Ok(p)) => p,
        Some(Err(_)) => return Err(bad("pdsim takes a priority of 32 bits (from -2147483648 to 2147483647)")),
    };
    let stream = body.stream.unwrap_or(false);
    let include_usage = stream && body.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    Ok(Ask { prompt, output, stream, include_usage, priority })
}

/// `text` read as Python's `int()` reads it (vLLM parses the priority
/// header so): blanks around, a sign, decimal digits with single
/// underscores between them; `None` where `int()` raises (vLLM then keeps
/// the body's priority). A number beyond 128 bits is read as the nearest
/// 128-bit one (refused as beyond 32 bits all the same).
fn python_int(text: &str) -> Option<i128> {
    let t = text.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    let well_formed = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__");
    if !well_formed {
        return None;
    }
    let negative = t.starts_with('-');
    // (Only overflow fails here: the digits are well formed.)
    let n: i128 = digits.replace('_', "").parse().unwrap_or(i128::MAX);
    Some(if negative { -n } else { n })
}

/// vLLM's error body (`ErrorResponse`).
pub fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400 => "BadRequestError",
        404 => "NotFoundError",
        503 => "ServiceUnavailableError",
        _ => "InternalServerError",
    };
    json!({"object": "error", "message": message, "type": kind, "param": null, "code": status})
}

/// Filler words, one per output token, in turn (plain ASCII: none needs a
/// JSON escape, which the streams' templates rely on).
const WORDS: [&str; 8] = [" lorem", " ipsum", " dolor", " sit", " amet", " consectetur", " adipiscing", " elit"];

/// The text of output token `i` (from 0): a filler word.
pub fn token_text(i: u64) -> &'static str {
    WORDS[(i % WORDS.len() as u64) as usize]
}

/// The usage object.
pub fn usage(prompt: u64, completion: u64) -> Value {
    json!({"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
        "prompt_tokens_details": null})
}

/// What every body of one response shares.
#[derive(Clone, Debug)]
pub struct Head {
    /// Which endpoint.
    pub kind: Kind,
    /// `cmpl-…` or `chatcmpl-…`.
    pub id: String,
    /// Unix seconds at arrival.
    pub created: u64,
    /// The served model's name.
    pub model: String,
}

impl Head {
    /// A response's head for simulated request `req`.
    pub fn new(kind: Kind, req: u64, created: u64, model: &str) -> Self {
        let id = match kind {
            Kind::Completion => format!("cmpl-pdsim-{req}"),
            Kind::Chat => format!("chatcmpl-pdsim-{req}"),
        };
        Head { kind, id, created, model: model.to_owned() }
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Chat, false) => "chat.completion",
        }
    }

    /// A streamed chunk: its choices (`[]` for the usage chunk) and usage.
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({"id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": choices});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    /// A chat stream's first chunk: the assistant's role, no text (as vLLM
    /// sends it).
    pub fn role_chunk(&self) -> Value {
        let choice = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null,
            "finish_reason": null});
        self.chunk(json!([choice]), None)
    }

    /// The chunk of output token `i`; `last`: the last, with its finish reason.
    pub fn token_chunk(&self, i: u64, last: bool) -> Value {
        let finish = if last { json!("length") } else { Value::Null };
        let text = token_text(i);
        let choice = match self.kind {
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish, "stop_reason": null})
            }
            Kind::Chat => {
                json!({"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": finish,
                    "stop_reason": null})
            }
        };
        self.chunk(json!([choice]), None)
    }

    /// A token chunk as the text around its token's JSON string, so that a
    /// stream writes each of its tokens but the last without building JSON:
    /// `data: ` + before + `"word"` + after + blank line is
    /// [`Head::token_chunk`]`(i, false)` as server-sent event.
    pub fn token_template(&self) -> (String, String) {
        const MARK: &str = "\u{1}pdsim-token\u{1}";
        let mut chunk = self.token_chunk(0, false);
        let text = match self.kind {
            Kind::Completion => &mut chunk["choices"][0]["text"],
            Kind::Chat => &mut chunk["choices"][0]["delta"]["content"],
        };
        *text = json!(MARK);
        let whole = chunk.to_string();
        let quoted = serde_json::to_string(MARK).expect("a string serializes");
        let (before, after) = whole.split_once(&quoted).expect("the mark is in the chunk once");
        (format!("data: {before}"), format!("{after}\n\n"))
    }

    /// The last chunk of a stream with `include_usage`: no choices, the usage.
    pub fn usage_chunk(&self, prompt: u64, completion: u64) -> Value {
        self.chunk(json!([]), Some(usage(prompt, completion)))
    }

    /// A whole (not streamed) response of `completion` output tokens.
    pub fn whole(&self, prompt: u64, completion: u64) -> Value {
        let text: String = (0..completion).map(token_text).collect();
        let choice = match self.kind {
            Kind::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length",
                "stop_reason": null, "prompt_logprobs": null}),
            Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": null, "finish_reason": "length", "stop_reason": null}),
        };
        json!({"id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "choices": [choice], "usage": usage(prompt, completion)})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: Value) -> Body {
        serde_json::from_value(v).unwrap()
    }

    /// The prompt-length rule, worked: "Hello, world" is 12 characters, 3
    /// tokens; a chat of two messages of 12 and 5 characters is
    /// ⌈17 / 4⌉ = 5, plus 2 × 4 per message, plus 3: 16.
    #[test]
    fn prompt_lengths_follow_the_documented_rule() {
        let c = |v| read(Kind::Completion, &body(v), None, Some(100)).map(|a| (a.prompt, a.output));
        assert_eq!(c(json!({"prompt": "Hello, world"})), Ok((3, 16)));
        assert_eq!(c(json!({"prompt": [1, 2, 3, 4, 5], "max_tokens": 7})), Ok((5, 7)));
        assert_eq!(c(json!({"prompt": "x", "prompt_token_ids": [1, 2]})), Ok((2, 16)));
        let chat = body(json!({"messages": [{"role": "system", "content": "Hello, world"},
            {"role": "user", "content": [{"type": "text", "text": "hello"}]}]}));
        let a = read(Kind::Chat, &chat, None, Some(100)).unwrap();
        assert_eq!((a.prompt, a.output), (16, 84), "chat's default output is what the model length leaves");
    }

    /// The template and the chunk it stands for are the same bytes.
    #[test]
    fn a_token_template_writes_the_token_chunk() {
        for kind in [Kind::Completion, Kind::Chat] {
            let head = Head::new(kind, 7, 1_700_000_000, "m\"odel");
            let (before, after) = head.token_template();
            for i in 0..10 {
                let fast = format!("{before}{}{after}", serde_json::to_string(token_text(i)).unwrap());
                assert_eq!(fast, format!("data: {}\n\n", head.token_chunk(i, false)));
            }
        }
    }

    #[test]
    fn what_vllm_refuses_is_refused_with_400() {
        let c = |v| read(Kind::Completion, &body(v), None, Some(100)).map_err(|r| r.status);
        assert_eq!(c(json!({"prompt_token_ids": vec![0; 100]})), Err(400), "prompt >= max_model_len");
        assert_eq!(c(json!({"prompt_token_ids": vec![0; 90], "max_tokens": 11})), Err(400), "90 + 11 > 100");
        assert!(c(json!({"prompt_token_ids": vec![0; 90], "max_tokens": 10})).is_ok());
        assert_eq!(c(json!({"prompt": "abc", "max_tokens": 4, "min_tokens": 5})), Err(400));
        assert_eq!(c(json!({"prompt": "abc", "n": 2})), Err(400));
        assert_eq!(c(json!({"prompt": "abc", "priority": 3_000_000_000i64})), Err(400), "beyond 32 bits");
        let p = |v| read(Kind::Completion, &body(v), None, Some(100)).map(|a| a.priority);
        assert_eq!(p(json!({"prompt": "abc"})), Ok(0), "vLLM's default");
        assert_eq!(p(json!({"prompt": "abc", "priority": -2})), Ok(-2));
        // vLLM's `X-Vllm-Priority` header takes the body's place when
        // Python's int() reads it, and is passed over when it does not.
        let h = |v, header| read(Kind::Completion, &body(v), Some(header), Some(100)).map(|a| a.priority);
        assert_eq!(h(json!({"prompt": "abc", "priority": -2}), " 7 "), Ok(7));
        assert_eq!(h(json!({"prompt": "abc"}), "-1_000"), Ok(-1000));
        assert_eq!(h(json!({"prompt": "abc", "priority": -2}), "high"), Ok(-2));
        assert_eq!(h(json!({"prompt": "abc", "priority": -2}), "1__0"), Ok(-2));
        assert_eq!(h(json!({"prompt": "abc", "priority": -2}), "+"), Ok(-2));
        assert_eq!(h(json!({"prompt": "abc"}), "3000000000").map_err(|r| r.status), Err(400));
        let huge = "9".repeat(40);
        assert_eq!(h(json!({"prompt": "abc"}), &huge).map_err(|r| r.status), Err(400), "beyond 128 bits");
        assert_eq!(h(json!({"prompt": "abc"}), &format!("-{huge}")).map_err(|r| r.status), Err(400));
        let e = error_body(400, "m");
        assert_eq!(
            e,
            json!({"object": "error", "message": "m", "type": "BadRequestError", "param": null, "code": 400})
        );
    }
}
