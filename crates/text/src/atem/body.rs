//! The ATEM markup of one tool message:
//!
//! ```text
//! <atem:function_calls>
//! <atem:invoke name="NAME">
//! <atem:parameter name="P">VALUE</atem:parameter>
//! </atem:invoke>
//! </atem:function_calls>
//! ```
//!
//! As the chat template writes it (`render_atem` in models/templates/muse-glimmer.jinja) and as
//! llama.cpp's grammar reads it (common/parsers/muse-glimmer.cpp): whitespace between tags is
//! optional, string values are verbatim up to `</atem:parameter>` ("spaces for string values are
//! not stripped"), other values are JSON. Leniencies over llama.cpp: several invokes in one block.

/// One `<atem:invoke>`: its name and its parameters, raw, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Invoke {
    pub name: String,
    pub params: Vec<(String, String)>,
}

/// Parses a complete tool message body; `None` if it is not well-formed ATEM.
pub fn parse(body: &str) -> Option<Vec<Invoke>> {
    let mut s = Cursor(body.trim_start());
    s.tag("<atem:function_calls>")?;
    let mut invokes = Vec::new();
    loop {
        s.skip_ws();
        if s.tag("</atem:function_calls>").is_some() {
            break;
        }
        s.tag("<atem:invoke name=\"")?;
        let name = s.until("\">")?.to_string();
        if name.is_empty() || name.contains(['<', '\n']) {
            return None;
        }
        let mut params = Vec::new();
        loop {
            s.skip_ws();
            if s.tag("<atem:parameter name=\"").is_none() {
                break;
            }
            let p = s.until("\">")?.to_string();
            if p.contains(['<', '\n']) {
                return None;
            }
            let v = s.until("</atem:parameter>")?.to_string();
            params.push((p, v));
        }
        s.tag("</atem:invoke>")?;
        invokes.push(Invoke { name, params });
    }
    (!invokes.is_empty() && s.0.trim().is_empty()).then_some(invokes)
}

struct Cursor<'a>(&'a str);

impl<'a> Cursor<'a> {
    fn tag(&mut self, t: &str) -> Option<()> {
        self.0 = self.0.strip_prefix(t)?;
        Some(())
    }

    /// The text before `end`, consuming both.
    fn until(&mut self, end: &str) -> Option<&'a str> {
        let i = self.0.find(end)?;
        let out = &self.0[..i];
        self.0 = &self.0[i + end.len()..];
        Some(out)
    }

    fn skip_ws(&mut self) {
        self.0 = self.0.trim_start();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_and_malformed() {
        let ok = "<atem:function_calls>\n<atem:invoke name=\"f\">\n<atem:parameter name=\"a\"> x\ny </atem:parameter>\n<atem:parameter name=\"b\">1</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
        assert_eq!(
            parse(ok),
            Some(vec![Invoke {
                name: "f".into(),
                params: vec![("a".into(), " x\ny ".into()), ("b".into(), "1".into())]
            }])
        );
        let compact = "<atem:function_calls><atem:invoke name=\"g\"></atem:invoke><atem:invoke name=\"h\"><atem:parameter name=\"q\">z</atem:parameter></atem:invoke></atem:function_calls>\n";
        assert_eq!(parse(compact).map(|v| v.len()), Some(2));
        for bad in [
            "",
            "hello",
            "<atem:function_calls>",
            "<atem:function_calls></atem:function_calls>",
            "<atem:function_calls>\n<atem:invoke name=\"f\">\n<atem:parameter name=\"a\">1</atem:invoke>\n</atem:function_calls>",
            "<atem:function_calls>\n<atem:invoke name=\"f\">\n</atem:invoke>\n</atem:function_calls> trailing",
            "<atem:function_calls>\n<atem:invoke name=\"\">\n</atem:invoke>\n</atem:function_calls>",
            "<atem:function_calls>\n<atem:invoke name=\"f\">\nstray text</atem:invoke>\n</atem:function_calls>",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
