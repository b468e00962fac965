//! Just enough JSON writing for log lines and `status --json`: flat objects
//! of strings, integers and booleans. Hand-written to keep the dependency
//! list short; the tests parse every line with a real JSON parser.

use std::fmt::Write;

pub struct Json {
    out: String,
}

impl Default for Json {
    fn default() -> Self {
        Json::new()
    }
}

impl Json {
    pub fn new() -> Json {
        Json {
            out: String::from("{"),
        }
    }

    fn key(&mut self, k: &str) {
        if self.out.len() > 1 {
            self.out.push(',');
        }
        escape_into(&mut self.out, k);
        self.out.push(':');
    }

    pub fn str(&mut self, k: &str, v: &str) -> &mut Json {
        self.key(k);
        escape_into(&mut self.out, v);
        self
    }

    pub fn opt_str(&mut self, k: &str, v: Option<&str>) -> &mut Json {
        match v {
            Some(v) => self.str(k, v),
            None => {
                self.key(k);
                self.out.push_str("null");
                self
            }
        }
    }

    pub fn int(&mut self, k: &str, v: i64) -> &mut Json {
        self.key(k);
        let _ = write!(self.out, "{v}");
        self
    }

    pub fn opt_int(&mut self, k: &str, v: Option<i64>) -> &mut Json {
        match v {
            Some(v) => self.int(k, v),
            None => {
                self.key(k);
                self.out.push_str("null");
                self
            }
        }
    }

    pub fn bool(&mut self, k: &str, v: bool) -> &mut Json {
        self.key(k);
        self.out.push_str(if v { "true" } else { "false" });
        self
    }

    pub fn finish(&mut self) -> String {
        let mut s = std::mem::take(&mut self.out);
        s.push('}');
        s
    }
}

/// A JSON string literal for `s`.
pub fn escape_into(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects() {
        let mut j = Json::new();
        j.str("a", "x\"y\\z\n\u{1}é")
            .int("n", -3)
            .bool("b", true)
            .opt_str("h", None);
        assert_eq!(
            j.finish(),
            r#"{"a":"x\"y\\z\n\u0001é","n":-3,"b":true,"h":null}"#
        );
        assert_eq!(Json::new().finish(), "{}");
    }
}
