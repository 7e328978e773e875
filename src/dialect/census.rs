//! A request body counted before it is parsed: its conversation elements (the items of `messages`, `input` or
//! `contents` and the content blocks inside them) and its JSON containers, in one pass over the bytes, whatever
//! the JSON. Admission (`server.max_messages`, `server.request_memory_bytes`) is decided on these counts, so that
//! a body of many tiny values is refused before parsing it costs tens of times its size.

/// What a body holds, counted from its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Census {
    /// Objects and arrays, at any depth.
    pub containers: u64,
    /// Conversation elements: the items of a top-level `messages`, `input` or `contents` array and the items of
    /// the arrays inside them (content blocks, parts).
    pub elements: u64,
    /// The body's length in bytes.
    pub bytes: u64,
}

/// The top-level keys whose arrays hold the conversation.
const CONVERSATION: [&[u8]; 3] = [b"messages", b"input", b"contents"];

/// Counts `body`'s containers and conversation elements. Invalid JSON is counted as far as it reads (the parse
/// that follows refuses it); strings are skipped with `memchr`, so the pass costs a fraction of a parse.
pub fn count(body: &[u8]) -> Census {
    let mut c = Census {
        bytes: body.len() as u64,
        ..Census::default()
    };
    // Depth of open containers; whether the value at depth 1 belongs to a conversation key; the key just read
    // at depth 1 (a string directly followed by `:`).
    let mut depth: usize = 0;
    let mut in_conversation = false;
    let mut last_key: (usize, usize) = (0, 0);
    // Whether each open container (up to depth 4) is an array.
    let mut arrays = [false; 5];
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => {
                let start = i + 1;
                let end = string_end(body, start);
                if depth == 1 {
                    last_key = (start, end);
                }
                i = end + 1;
                continue;
            }
            b @ (b'{' | b'[') => {
                c.containers += 1;
                if depth == 1 && b == b'[' {
                    in_conversation = is_conversation_key(body, last_key);
                }
                // An element: a value opening inside a conversation array (depth 2) or inside an array of one of
                // its elements (depth 4).
                if in_conversation && (depth == 2 || depth == 4) && arrays[depth - 1] {
                    c.elements += 1;
                }
                if let Some(slot) = arrays.get_mut(depth) {
                    *slot = b == b'[';
                }
                depth += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                // the value of a top-level key ended
                if depth == 1 {
                    in_conversation = false;
                }
            }
            // A scalar element of a conversation array (a string is counted above only as a key or value).
            _ => {}
        }
        i += 1;
    }
    c
}

/// Whether the key whose contents lie at `start..end` names a conversation array, as the parse will read it (an
/// escaped key, `"mess\u0061ges"`, is decoded first).
fn is_conversation_key(body: &[u8], (start, end): (usize, usize)) -> bool {
    let raw = body.get(start..end).unwrap_or_default();
    if memchr::memchr(b'\\', raw).is_none() {
        return CONVERSATION.contains(&raw);
    }
    let quoted = body.get(start.saturating_sub(1)..(end + 1).min(body.len()));
    match quoted.map(serde_json::from_slice::<String>) {
        Some(Ok(k)) => CONVERSATION.contains(&k.as_bytes()),
        _ => false,
    }
}

/// The index of the `"` that closes the string whose contents start at `start` (or the body's end).
fn string_end(body: &[u8], mut at: usize) -> usize {
    loop {
        match memchr::memchr2(b'"', b'\\', body.get(at..).unwrap_or_default()) {
            None => return body.len(),
            Some(k) if body[at + k] == b'\\' => at += k + 2,
            Some(k) => return at + k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_messages_blocks_and_containers() {
        let body = json!({"model":"m","messages":[
            {"role":"user","content":"a \" [ { \\"},
            {"role":"assistant","content":[{"type":"text","text":"]}"},{"type":"tool_use","input":{"a":[1]}}]},
        ],"tools":[{"name":"t","input_schema":{"type":"object"}}]})
        .to_string();
        let c = count(body.as_bytes());
        // 2 messages + 2 blocks; the tools are no conversation elements
        assert_eq!(c.elements, 4, "{c:?}");
        // the body, messages, 2 messages, a content array, 2 blocks, an input object and its array, tools, a
        // tool, its schema
        assert_eq!(c.containers, 12, "{c:?}");
        assert_eq!(c.bytes, body.len() as u64);
    }

    #[test]
    fn counts_input_and_contents_and_only_top_level_keys() {
        let responses = json!({"input":[{"type":"message","content":[{"type":"input_text","text":"x"}]},
            {"type":"function_call_output","output":"y"}],"metadata":{"messages":[{"a":1},{"b":2}]}});
        assert_eq!(count(responses.to_string().as_bytes()).elements, 3);
        let gemini = json!({"contents":[{"role":"user","parts":[{"text":"a"},{"text":"b"}]}]});
        assert_eq!(count(gemini.to_string().as_bytes()).elements, 3);
    }

    #[test]
    fn many_tiny_messages_are_counted_whatever_the_layout() {
        let mut body = String::from("{\"messages\" :\n [");
        for i in 0..1000 {
            if i > 0 {
                body.push_str(" ,\n");
            }
            body.push_str(&format!("{{\"role\":\"user\",\"content\":\"m{i}\"}}"));
        }
        body.push_str("]}");
        assert_eq!(count(body.as_bytes()).elements, 1000);
        // an escaped key is the key the parse will read
        assert_eq!(count(br#"{"mess\u0061ges":[{},{}]}"#).elements, 2);
    }

    #[test]
    fn invalid_or_truncated_json_is_counted_as_far_as_it_reads() {
        for raw in [
            &b""[..],
            b"{",
            b"{\"messages\":[{",
            b"\"open",
            b"]]]}}}",
            b"{\"messages\":[{\"a\":\"\\",
        ] {
            let c = count(raw);
            assert!(c.elements <= 1 && c.containers <= 3, "{raw:?}: {c:?}");
        }
    }
}
