//! Key templates: `"pay:{cb.provider}:{cb.txn_id}"` split into literal text and placeholders,
//! each placeholder a path of an argument (or `self`) and its fields.

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Literal text, braces unescaped.
    Text(String),
    /// `{a.b.c}`: the argument `a` (or `self`) and the fields `b`, `c` (names or tuple indexes);
    /// `{a.b?}` when its value may be empty.
    Field {
        /// The argument and its fields.
        path: Vec<String>,
        /// Written `{...?}`: an empty value is allowed.
        may_be_empty: bool,
    },
}

/// Splits a template into pieces, or says what is wrong with it.
pub(crate) fn parse(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().map(|&(_, c)| c) == Some('{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek().map(|&(_, c)| c) == Some('}') => {
                chars.next();
                text.push('}');
            }
            '}' => {
                return Err(format!(
                    "unmatched `}}` at byte {at} of the key template (write `}}}}` for a literal brace)"
                ))
            }
            '{' => {
                let rest = &template[at + 1..];
                let Some(end) = rest.find(['}', '{']).filter(|&end| rest.as_bytes()[end] == b'}') else {
                    return Err(format!(
                        "unclosed `{{` at byte {at} of the key template (write `{{{{` for a literal brace)"
                    ));
                };
                let inner = &rest[..end];
                let close = at + 1 + end;
                while chars.next_if(|&(i, _)| i <= close).is_some() {}
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                let (inner, may_be_empty) = match inner.strip_suffix('?') {
                    Some(inner) => (inner, true),
                    None => (inner, false),
                };
                pieces.push(Piece::Field { path: placeholder(inner)?, may_be_empty });
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// The path inside `{...}`: an identifier, then `.field` or `.0` steps.
fn placeholder(inner: &str) -> Result<Vec<String>, String> {
    let bad = || {
        format!(
            "`{{{inner}}}` is not a key placeholder: write `{{arg}}`, `{{arg.field.sub}}` or `{{self.field}}`, \
             with a `?` at the end if its value may be empty (no format specs; the values are formatted with \
             `Display`)"
        )
    };
    if inner.trim().is_empty() {
        return Err("empty `{}` in the key template: name an argument, `{arg}` or `{arg.field}`".into());
    }
    let path: Vec<String> = inner.split('.').map(str::to_owned).collect();
    for (i, segment) in path.iter().enumerate() {
        let ident = segment.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && segment.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && segment != "_";
        let index = i > 0 && !segment.is_empty() && segment.chars().all(|c| c.is_ascii_digit());
        if !(ident || index) {
            return Err(bad());
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(path: &[&str]) -> Piece {
        Piece::Field { path: path.iter().map(|s| s.to_string()).collect(), may_be_empty: false }
    }

    #[test]
    fn splits_text_and_fields() {
        let pieces = parse("pay:{cb.provider}:{cb.txn_id}").unwrap();
        assert_eq!(
            pieces,
            vec![
                Piece::Text("pay:".into()),
                field(&["cb", "provider"]),
                Piece::Text(":".into()),
                field(&["cb", "txn_id"]),
            ]
        );
        assert_eq!(parse("{self.pair.0}").unwrap(), vec![field(&["self", "pair", "0"])]);
        assert_eq!(parse("static").unwrap(), vec![Piece::Text("static".into())]);
        assert_eq!(
            parse("a:{note?}").unwrap(),
            vec![Piece::Text("a:".into()), Piece::Field { path: vec!["note".into()], may_be_empty: true }]
        );
    }

    #[test]
    fn escapes_braces() {
        assert_eq!(parse("{{x}}:{x}").unwrap(), vec![Piece::Text("{x}:".into()), field(&["x"])]);
    }

    #[test]
    fn rejects_malformed() {
        for (bad, says) in [
            ("a{b", "unclosed"),
            ("a{b{c}", "unclosed"),
            ("a}b", "unmatched"),
            ("{}", "empty"),
            ("{ }", "empty"),
            ("{a:?}", "not a key placeholder"),
            ("{a.}", "not a key placeholder"),
            ("{0}", "not a key placeholder"),
            ("{a b}", "not a key placeholder"),
            ("{_}", "not a key placeholder"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }
}
