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

use std::{collections::BTreeMap, fmt};

use crate::config::ConfigError;

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
pub fn resolve(properties: &mut BTreeMap<String, String>) -> Result<(), ConfigError> {
    for (name, value) in properties.iter_mut() {
        let fail = |m: String| ConfigError::Invalid(format!("kafka property {name}: {m}"));
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
