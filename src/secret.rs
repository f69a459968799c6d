//! Kafka secrets: librdkafka property values that come from elsewhere and
//! must not be seen.
//!
//! A property value may be a reference, resolved once at start-up:
//!
//! - `env:NAME`: the value of environment variable `NAME`;
//! - `file:/path`: the contents of the file, without a final newline;
//! - `raw:...`: the rest as it is, for a value that starts with `env:` or
//!   `file:` itself.
//!
//! Values of properties whose names mark them as secret (see
//! [`is_sensitive`]) are never logged or shown in errors: [`Redacted`]
//! formats a property map with them hidden, and [`redact`] scrubs them from
//! an error text (librdkafka repeats a refused value in its error).
//! [`check_property`] asks librdkafka about one property and words its
//! refusal without the value; [`parse_list`] reads the comma-separated form
//! of `HOURGLASS_KAFKA_PROPERTIES` and names a bad item by its position, so
//! that a fragment of a value split at the wrong comma never shows.
//! [`Secret`] holds a value that `Debug` and `Display` never show.

use std::{collections::BTreeMap, fmt};

use rdkafka::{ClientConfig, error::KafkaError, types::RDKafkaConfRes};

/// What is wrong with a Kafka property or a reference to a secret. Never
/// holds a value; for an item of `HOURGLASS_KAFKA_PROPERTIES`, not even
/// its name (it may be a piece of a value split at a comma).
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("{what} is not a librdkafka property{hint}")]
    UnknownProperty { what: String, hint: &'static str },
    #[error("{what}: librdkafka refuses its value: {reason}")]
    RefusedValue { what: String, reason: String },
    #[error("item {0} of HOURGLASS_KAFKA_PROPERTIES is not KEY=VALUE (write a comma inside a value as \\,)")]
    NotKeyValue(usize),
    #[error("--kafka-property number {0} is not KEY=VALUE")]
    FlagNotKeyValue(usize),
    #[error("kafka property {property}: {reason}")]
    Unresolved { property: String, reason: String },
}

/// A value that must not be seen: `Debug` and `Display` show
/// `[redacted]`; [`Secret::expose`] gives the value to whoever uses it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Secret, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// Librdkafka properties, as a map whose `Debug` hides secret values.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Properties(pub BTreeMap<String, String>);

/// Shown (`hourglass serve --print-config`) with secret values hidden.
impl serde::Serialize for Properties {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, if is_sensitive(name) { "[redacted]" } else { value })?;
        }
        map.end()
    }
}

impl std::ops::Deref for Properties {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Properties {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Redacted(&self.0).fmt(f)
    }
}

impl<const N: usize> From<[(String, String); N]> for Properties {
    fn from(items: [(String, String); N]) -> Properties {
        Properties(BTreeMap::from(items))
    }
}

/// Where a property came from, for naming it in an error.
#[derive(Clone, Copy, Debug)]
pub enum Origin {
    /// A flag or the config file: the name is the user's own.
    Named,
    /// Item `n` (from 1) of `HOURGLASS_KAFKA_PROPERTIES`: the "name" may be
    /// a piece of a value split at a comma, so it is not shown.
    ListItem(usize),
}

/// Whether librdkafka knows the property `name`, and takes `value` for it
/// (unless `value` is an `env:`/`file:` reference, resolved only at start).
/// The error never holds the value; for a list item, not the name either.
pub fn check_property(name: &str, value: &str, origin: Origin) -> Result<(), SecretError> {
    let what = match origin {
        Origin::Named if looks_like_a_name(name) => format!("kafka property {name}"),
        // A value given where a name belongs, perhaps: not repeated.
        Origin::Named => "a kafka property whose name is not a property name (not shown)".to_owned(),
        Origin::ListItem(n) => format!("item {n} of HOURGLASS_KAFKA_PROPERTIES"),
    };
    // A reference is resolved at start-up: only its name is checked now
    // (an empty value is refused as invalid, never as unknown).
    let reference = is_reference(value);
    let tried = if reference { "" } else { value };
    match ClientConfig::new().set(name, tried).create_native_config() {
        Err(KafkaError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, ..)) => {
            let hint = match origin {
                Origin::Named => "",
                Origin::ListItem(_) => " (write a comma inside a value as \\,)",
            };
            Err(SecretError::UnknownProperty { what, hint })
        }
        Err(KafkaError::ClientConfig(_, desc, _, _)) if !reference => {
            let desc = if value.is_empty() { desc } else { desc.replace(value, "[redacted]") };
            Err(SecretError::RefusedValue { what, reason: desc })
        }
        _ => Ok(()),
    }
}

/// librdkafka's names: lowercase words joined by dots and underscores.
fn looks_like_a_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_'))
}

fn is_reference(value: &str) -> bool {
    ["env:", "file:", "raw:"].iter().any(|p| value.starts_with(p))
}

/// The items of a comma-separated `KEY=VALUE` list, as
/// `HOURGLASS_KAFKA_PROPERTIES` holds them: `\,` is a comma inside a value,
/// `\\` a backslash; empty items are skipped. Errors name an item by its
/// position, never its text.
pub fn parse_list(list: &str) -> Result<Vec<(usize, String, String)>, SecretError> {
    let mut items = vec![String::new()];
    let mut chars = list.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ (',' | '\\')) => items.last_mut().expect("one item").push(escaped),
                Some(other) => {
                    let item = items.last_mut().expect("one item");
                    item.push('\\');
                    item.push(other);
                }
                None => items.last_mut().expect("one item").push('\\'),
            },
            ',' => items.push(String::new()),
            c => items.last_mut().expect("one item").push(c),
        }
    }
    let mut out = Vec::new();
    for (n, item) in (1..).zip(items) {
        if item.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = item.split_once('=') else {
            return Err(SecretError::NotKeyValue(n));
        };
        out.push((n, key.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(out)
}

/// Parts of a property name that mark its value as secret: passwords, keys,
/// OAuth and Kerberos settings, JAAS, tokens.
const SENSITIVE: &[&str] = &[
    "password",
    "secret",
    "sasl.oauthbearer",
    "sasl.jaas",
    "ssl.key.pem",
    "keystore",
    "token",
    "credential",
];

/// Whether the value of property `name` is a secret.
pub fn is_sensitive(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SENSITIVE.iter().any(|part| name.contains(part))
}

/// Replaces every `env:`, `file:` and `raw:` value by what it refers to.
/// Errors name the property and the variable or file, never a value.
pub fn resolve(properties: &mut BTreeMap<String, String>) -> Result<(), SecretError> {
    for (name, value) in properties.iter_mut() {
        let fail = |reason: String| SecretError::Unresolved { property: name.clone(), reason };
        let resolved = if let Some(var) = value.strip_prefix("env:") {
            std::env::var(var).map_err(|e| fail(format!("environment variable {var}: {e}")))?
        } else if let Some(path) = value.strip_prefix("file:") {
            let mut text =
                std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read {path}: {e}")))?;
            let end = text.trim_end_matches(['\r', '\n']).len();
            text.truncate(end);
            text
        } else if let Some(raw) = value.strip_prefix("raw:") {
            raw.to_owned()
        } else {
            continue;
        };
        *value = resolved;
    }
    Ok(())
}

/// `text` with the value of every secret property replaced.
pub fn redact(text: &str, properties: &BTreeMap<String, String>) -> String {
    let mut text = text.to_owned();
    for (name, value) in properties {
        if is_sensitive(name) && !value.is_empty() {
            text = text.replace(value.as_str(), "[redacted]");
        }
    }
    text
}

/// A property map for `Debug`, with secret values hidden.
pub struct Redacted<'a>(pub &'a BTreeMap<String, String>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, value)| {
                let value = if is_sensitive(name) { "[redacted]" } else { value.as_str() };
                (name, value)
            }))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A password with every character that has tripped a parser.
    const PASSWORD: &str = "Pw1,Xq9=Zk\"Jj";

    #[test]
    fn a_list_takes_escaped_commas_and_names_bad_items_by_position() {
        let items =
            parse_list("sasl.password=Pw1\\,Xq9=Zk\"Jj, security.protocol=SASL_SSL,,a\\\\b=c\\d").unwrap();
        assert_eq!(
            items,
            [
                (1, "sasl.password".to_owned(), PASSWORD.to_owned()),
                (2, "security.protocol".to_owned(), "SASL_SSL".to_owned()),
                (4, "a\\b".to_owned(), "c\\d".to_owned()),
            ]
        );
        // The same password unescaped: the piece after the comma is no
        // property, and neither piece may show.
        let err = parse_list("sasl.password=Pw1,Xq9").unwrap_err().to_string();
        assert!(err.contains("item 2 of HOURGLASS_KAFKA_PROPERTIES"), "{err}");
        for piece in ["Pw1", "Xq9"] {
            assert!(!err.contains(piece), "{err}");
        }
    }

    #[test]
    fn a_property_check_never_shows_a_value_nor_a_list_items_name() {
        check_property("sasl.password", PASSWORD, Origin::Named).unwrap();
        check_property("security.protocol", "env:PROTOCOL", Origin::Named).unwrap();
        let err = check_property("security.protocol", PASSWORD, Origin::Named).unwrap_err().to_string();
        assert!(err.contains("kafka property security.protocol") && !err.contains("Pw1"), "{err}");
        let err = check_property("no.such.property", "x", Origin::Named).unwrap_err().to_string();
        assert!(err.contains("kafka property no.such.property is not a librdkafka property"), "{err}");
        // A password given as a whole flag: its "name" is not repeated.
        let err = check_property("Pw1,Xq9", "Zk\"Jj", Origin::Named).unwrap_err().to_string();
        assert!(!err.contains("Pw1") && !err.contains("Zk"), "{err}");
        // An unescaped comma split the password: its second piece looks like
        // a property named `Xq9`.
        let err = check_property("Xq9", "Zk\"Jj", Origin::ListItem(2)).unwrap_err().to_string();
        assert!(err.contains("item 2 of HOURGLASS_KAFKA_PROPERTIES"), "{err}");
        for piece in ["Xq9", "Zk"] {
            assert!(!err.contains(piece), "{err}");
        }
    }

    #[test]
    fn secrets_and_property_maps_hide_their_values() {
        let secret = Secret::new(PASSWORD);
        assert_eq!((format!("{secret:?}"), secret.to_string()), ("[redacted]".into(), "[redacted]".into()));
        let properties = Properties::from([("sasl.password".to_owned(), PASSWORD.to_owned())]);
        assert!(!format!("{properties:?}").contains("Pw1"));
    }

    #[test]
    fn secret_names_are_recognised() {
        for name in [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "SASL.PASSWORD",
        ] {
            assert!(is_sensitive(name), "{name}");
        }
        for name in
            ["sasl.username", "security.protocol", "sasl.mechanism", "compression.type", "ssl.ca.location"]
        {
            assert!(!is_sensitive(name), "{name}");
        }
    }

    #[test]
    fn references_are_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "from-a-file\n").unwrap();
        // A name no other test or process sets.
        let var = format!("HOURGLASS_TEST_SECRET_{}", std::process::id());
        // SAFETY: no other thread of this test binary reads or writes this
        // variable.
        unsafe { std::env::set_var(&var, "from-the-env") };
        let mut properties = BTreeMap::from([
            ("sasl.password".to_owned(), format!("env:{var}")),
            ("ssl.key.password".to_owned(), format!("file:{}", file.display())),
            ("sasl.username".to_owned(), "raw:env:literal".to_owned()),
            ("compression.type".to_owned(), "zstd".to_owned()),
        ]);
        resolve(&mut properties).unwrap();
        assert_eq!(properties["sasl.password"], "from-the-env");
        assert_eq!(properties["ssl.key.password"], "from-a-file");
        assert_eq!(properties["sasl.username"], "env:literal");
        assert_eq!(properties["compression.type"], "zstd");
    }

    #[test]
    fn a_missing_reference_names_the_property_not_a_value() {
        let mut properties =
            BTreeMap::from([("sasl.password".to_owned(), "env:HOURGLASS_TEST_UNSET_VAR".to_owned())]);
        let err = resolve(&mut properties).unwrap_err().to_string();
        assert!(
            err.contains("kafka property sasl.password") && err.contains("HOURGLASS_TEST_UNSET_VAR"),
            "{err}"
        );
        let mut properties =
            BTreeMap::from([("sasl.password".to_owned(), "file:/nonexistent/pw".to_owned())]);
        let err = resolve(&mut properties).unwrap_err().to_string();
        assert!(err.contains("kafka property sasl.password") && err.contains("/nonexistent/pw"), "{err}");
    }

    #[test]
    fn secrets_are_hidden_in_debug_and_errors() {
        let properties = BTreeMap::from([
            ("sasl.password".to_owned(), "hunter2".to_owned()),
            ("sasl.username".to_owned(), "hourglass".to_owned()),
        ]);
        let shown = format!("{:?}", Redacted(&properties));
        assert!(
            !shown.contains("hunter2") && shown.contains("[redacted]") && shown.contains("hourglass"),
            "{shown}"
        );
        let error = "Invalid value \"hunter2\" for configuration property \"sasl.password\"";
        assert_eq!(
            redact(error, &properties),
            "Invalid value \"[redacted]\" for configuration property \"sasl.password\""
        );
    }
}
