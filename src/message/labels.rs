//! Labels: a few `key=value` pairs a caller sets on a message, to find it
//! and act on it by its own words (`order=42`, `tenant=acme`) rather than
//! by id. They stay with the message in hourglass and are not produced.
//! A [`Selector`] picks messages by their labels.

use super::Invalid;

/// A message's labels, sorted by key, each key once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Vec<(String, String)>);

impl Labels {
    /// Labels on one message, at most.
    pub const MAX: usize = 16;
    /// A key's length, at most.
    pub const KEY_MAX: usize = 63;
    /// A value's length, at most.
    pub const VALUE_MAX: usize = 255;

    /// Labels as a caller gives them, checked.
    pub fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Result<Labels, Invalid> {
        let mut pairs: Vec<(String, String)> = pairs.into_iter().collect();
        if pairs.len() > Self::MAX {
            return Err(Invalid::new(
                "labels",
                format!("has {} labels; the limit is {}", pairs.len(), Self::MAX),
            ));
        }
        for (key, value) in &pairs {
            check_key(key)?;
            check_value(key, value)?;
        }
        pairs.sort();
        if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Invalid::new("labels", format!("key {:?} is given twice", w[0].0)));
        }
        Ok(Labels(pairs))
    }

    /// Labels as the store or the log holds them: checked when they were
    /// set.
    pub fn from_stored(pairs: impl IntoIterator<Item = (String, String)>) -> Labels {
        let mut pairs: Vec<(String, String)> = pairs.into_iter().collect();
        pairs.sort();
        Labels(pairs)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_pairs(self) -> Vec<(String, String)> {
        self.0
    }
}

/// 1 to 63 letters, digits, `.`, `_`, `-` or `/`, starting with a letter
/// or digit.
fn check_key(key: &str) -> Result<(), Invalid> {
    if key.is_empty() || key.len() > Labels::KEY_MAX {
        return Err(Invalid::new(
            "labels",
            format!("key {key:?} must have 1 to {} characters", Labels::KEY_MAX),
        ));
    }
    if !key.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(Invalid::new("labels", format!("key {key:?} must start with a letter or a digit")));
    }
    if let Some(c) = key.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return Err(Invalid::new(
            "labels",
            format!("key {key:?} contains {c:?}; use letters, digits, '.', '_', '-' and '/'"),
        ));
    }
    Ok(())
}

/// Up to 255 letters, digits, `.`, `_`, `-`, `/`, `:`, `@` or `+`: what a
/// selector can name without quoting.
fn check_value(key: &str, value: &str) -> Result<(), Invalid> {
    if value.len() > Labels::VALUE_MAX {
        return Err(Invalid::new(
            "labels",
            format!("the value of {key:?} is longer than {} characters", Labels::VALUE_MAX),
        ));
    }
    if let Some(c) = value.chars().find(|c| !is_value_char(*c)) {
        return Err(Invalid::new(
            "labels",
            format!(
                "the value of {key:?} contains {c:?}; use letters, digits, '.', '_', '-', '/', ':', '@' and '+'"
            ),
        ));
    }
    Ok(())
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '@' | '+')
}

/// What a message must still be for a change of it to go through: the
/// label selector and topic it was found by. A cancel by selector lists
/// first and cancels each message by id; one replaced in between with
/// other labels or for another topic is left alone, checked in the same
/// step of the store as the cancel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matching {
    pub selector: Selector,
    /// None: any topic.
    pub topic: Option<String>,
}

impl Matching {
    pub fn holds(&self, topic: &str, labels: &Labels) -> bool {
        self.topic.as_deref().is_none_or(|t| t == topic) && self.selector.matches(labels)
    }
}

/// Which labels a message must have: terms separated by commas, all of
/// which must hold. `key=value` (the label is set to the value), `key!=value`
/// (it is not: unset, or another value), `key` (it is set), `!key` (it is
/// not).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    text: String,
    terms: Vec<Term>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Term {
    Is(String, String),
    IsNot(String, String),
    Has(String),
    Lacks(String),
}

impl Selector {
    /// The most terms a selector holds: twice the labels a message may
    /// carry, room for a `key` and a `!key` of each.
    pub const MAX_TERMS: usize = 2 * Labels::MAX;
    /// The longest selector read, in bytes: every term at its longest.
    pub const MAX_BYTES: usize = 4096;

    /// Reads a selector; `field` names it in errors. An empty text selects
    /// every message.
    pub fn parse(field: &'static str, text: &str) -> Result<Selector, Invalid> {
        let bad = |reason: String| Invalid::new(field, reason);
        if text.len() > Self::MAX_BYTES {
            return Err(bad(format!(
                "is {} bytes long; a selector has at most {}",
                text.len(),
                Self::MAX_BYTES
            )));
        }
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let parsed = if let Some((key, value)) = term.split_once("!=") {
                Term::IsNot(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once('=') {
                Term::Is(key.trim().to_owned(), value.trim_start_matches('=').trim().to_owned())
            } else if let Some(key) = term.strip_prefix('!') {
                Term::Lacks(key.trim().to_owned())
            } else {
                Term::Has(term.to_owned())
            };
            let (Term::Is(key, _) | Term::IsNot(key, _) | Term::Has(key) | Term::Lacks(key)) = &parsed;
            check_key(key).map_err(|e| bad(format!("term {term:?}: {}", e.reason)))?;
            if let Term::Is(key, value) | Term::IsNot(key, value) = &parsed {
                check_value(key, value).map_err(|e| bad(format!("term {term:?}: {}", e.reason)))?;
            }
            terms.push(parsed);
            if terms.len() > Self::MAX_TERMS {
                return Err(bad(format!("has more than {} terms, the most a selector has", Self::MAX_TERMS)));
            }
        }
        if terms.is_empty() && !text.trim().is_empty() {
            return Err(bad(format!("{text:?} has no terms; write key=value, key!=value, key or !key")));
        }
        Ok(Selector { text: text.trim().to_owned(), terms })
    }

    /// Whether it selects every message.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The selector as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.terms.iter().all(|term| match term {
            Term::Is(key, value) => labels.get(key) == Some(value.as_str()),
            Term::IsNot(key, value) => labels.get(key) != Some(value.as_str()),
            Term::Has(key) => labels.get(key).is_some(),
            Term::Lacks(key) => labels.get(key).is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Labels::new(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
    }

    #[test]
    fn labels_are_checked_and_kept_sorted() {
        let l = labels(&[("order", "42"), ("app/tenant", "acme"), ("empty", "")]);
        assert_eq!(l.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["app/tenant", "empty", "order"]);
        assert_eq!(l.get("order"), Some("42"));
        let refused = |pairs: &[(&str, &str)]| {
            Labels::new(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap_err().reason
        };
        assert!(refused(&[("", "v")]).contains("1 to 63"));
        assert!(refused(&[("-k", "v")]).contains("start with"));
        assert!(refused(&[("k k", "v")]).contains("' '"));
        assert!(refused(&[("k", "a,b")]).contains("','"));
        assert!(refused(&[("k", "1"), ("k", "2")]).contains("twice"));
        let many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(Labels::new(many).unwrap_err().reason.contains("limit is 16"));
        assert!(refused(&[("k", &"v".repeat(256))]).contains("longer than 255"));
    }

    #[test]
    fn a_selector_holds_when_all_its_terms_do() {
        let l = labels(&[("order", "42"), ("kind", "reminder")]);
        let selects = |text: &str| Selector::parse("selector", text).unwrap().matches(&l);
        assert!(selects("order=42"));
        assert!(selects("order=42, kind=reminder"));
        assert!(!selects("order=42,kind=digest"));
        assert!(selects("order!=43") && !selects("order!=42"));
        assert!(selects("kind") && !selects("tenant"));
        assert!(selects("!tenant") && !selects("!kind"));
        assert!(selects("tenant!=acme"), "an unset label is not acme");
        assert!(selects(""), "an empty selector selects everything");
        assert!(Selector::parse("selector", "").unwrap().is_empty());
        for bad in ["order=4 2", "=42", ",", "k=a;b"] {
            let e = Selector::parse("selector", bad).unwrap_err();
            assert_eq!(e.field, "selector", "{bad}: {e:?}");
        }
    }

    #[test]
    fn a_selector_is_bounded_in_terms_and_bytes() {
        let terms = |n: usize| (0..n).map(|i| format!("k{i}")).collect::<Vec<_>>().join(",");
        assert!(Selector::parse("selector", &terms(Selector::MAX_TERMS)).is_ok());
        let e = Selector::parse("selector", &terms(Selector::MAX_TERMS + 1)).unwrap_err();
        assert!(e.reason.contains("more than 32 terms"), "{e:?}");
        let long = format!("k={}", "v".repeat(Selector::MAX_BYTES));
        let e = Selector::parse("selector", &long).unwrap_err();
        assert!(e.reason.contains("bytes long"), "{e:?}");
    }
}
