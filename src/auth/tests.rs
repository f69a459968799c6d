//! The tokens file, bearer tokens, vouched calls and what a grant allows.

use super::*;

fn hex(hash: [u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn tokens() -> Tokens {
    Tokens::parse(&format!(
        r#"
        [[token]]
        name = "orders"
        sha256 = "{}"
        topics = ["orders.*", "audit"]

        [[token]]
        name = "ops"
        token = "ops-secret"
        topics = ["*"]
        "#,
        hex(digest(b"orders-secret"))
    ))
    .unwrap()
}

fn metadata(authorization: &str) -> MetadataMap {
    let mut m = MetadataMap::new();
    m.insert("authorization", authorization.parse().unwrap());
    m
}

#[test]
fn patterns_match_exact_names_prefixes_and_everything() {
    let tokens = tokens();
    let orders = tokens.find("orders-secret").unwrap();
    assert_eq!(orders.name, "orders");
    assert!(orders.allows("orders.created"));
    assert!(orders.allows("orders."));
    assert!(orders.allows("audit"));
    assert!(!orders.allows("audit2"));
    assert!(!orders.allows("orders"));
    assert!(!orders.allows("payments"));
    let ops = tokens.find("ops-secret").unwrap();
    assert!(ops.allows("anything"));
    assert!(tokens.find("wrong").is_none());
    assert!(tokens.find("").is_none());
}

#[test]
fn sha256_of_the_documented_example_is_the_plain_digest() {
    assert_eq!(hex(digest(b"test")), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
    assert_eq!(parse_hex_digest(&hex(digest(b"x")).to_uppercase()), Some(digest(b"x")));
}

#[test]
fn a_bad_file_is_refused_with_the_entry_named_and_no_token_shown() {
    let cases = [
        ("", "no [[token]]"),
        ("[[token]]\nname = \"a\"\ntopics = [\"*\"]", "exactly one of"),
        ("[[token]]\nname = \"a\"\ntoken = \"s3cret\"\nsha256 = \"00\"\ntopics = [\"*\"]", "exactly one of"),
        ("[[token]]\nname = \"a\"\nsha256 = \"abc\"\ntopics = [\"*\"]", "64 hex digits"),
        ("[[token]]\nname = \"a\"\ntoken = \"s3cret\"\ntopics = []", "no topics"),
        ("[[token]]\nname = \"a\"\ntoken = \"s3cret\"\ntopics = [\"a*b\"]", "may only end"),
        ("[[token]]\nname = \"a\"\ntoken = \"s3cret\"\ntopics = [\"\"]", "empty topic"),
        ("[[token]]\nname = \"a\"\ntoken = \"\"\ntopics = [\"*\"]", "empty"),
        (
            "[[token]]\nname = \"a\"\ntoken = \"s3cret\"\ntopics = [\"*\"]\n\
             [[token]]\nname = \"b\"\ntoken = \"s3cret\"\ntopics = [\"*\"]",
            "another name",
        ),
        (
            "[[token]]\nname = \"a\"\ntoken = \"s3cret\"\ntopics = [\"*\"]\n\
             [[token]]\nname = \"a\"\ntoken = \"other\"\ntopics = [\"*\"]",
            "used twice",
        ),
        ("[[token]]\nname = \"a\"\ntoken = \"s3cret\ntopics = [\"*\"]", "near line 3"),
    ];
    for (text, expected) in cases {
        let err = Tokens::parse(text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text:?}: {err}");
        assert!(!err.contains("s3cret"), "a token leaked into {err}");
    }
}

#[test]
fn the_file_is_named_in_errors() {
    let err = Tokens::load(Path::new("/nonexistent/tokens.toml")).unwrap_err().to_string();
    assert!(err.contains("--auth-tokens /nonexistent/tokens.toml: cannot read it"), "{err}");
}

fn with_tokens() -> Authenticator {
    Authenticator { tokens: Some((PathBuf::new(), Arc::new(RwLock::new(Arc::new(tokens()))))), vouches: None }
}

/// Vouches as its metadata says: `vouch: ops` for the grant ops,
/// `vouch: -` for open access, `vouch: no` refused.
struct Stub;

impl Vouches for Stub {
    fn vouch(&self, metadata: &MetadataMap) -> Vouch {
        match metadata.get("vouch").map(|v| v.to_str().unwrap()) {
            None => Vouch::None,
            Some("-") => Vouch::For(None),
            Some("no") => Vouch::Refused("no vouch".into()),
            Some(name) => Vouch::For(Some(name.to_owned())),
        }
    }
}

#[test]
fn a_call_another_node_vouches_for_gets_this_node_s_grant_of_its_name() {
    let auth = with_tokens().vouched_by(Arc::new(Stub));
    let vouched = |name: &str| {
        let mut m = MetadataMap::new();
        m.insert("vouch", name.parse().unwrap());
        auth.authenticate(&m)
    };
    let Ok(Access::Granted { grant, .. }) = vouched("ops") else { panic!("not granted") };
    assert_eq!(grant.name, "ops", "no token needed");
    for refused in ["no", "nobody", "-"] {
        let err = vouched(refused).unwrap_err();
        assert!(matches!(err, Error::Unvouched(_)), "{refused}: {err}");
        assert_eq!(Status::from(err).code(), tonic::Code::Unauthenticated);
    }
    let unknown = vouched("nobody").unwrap_err().to_string();
    assert!(unknown.contains("give every node the same --auth-tokens"), "{unknown}");
    assert!(matches!(auth.authenticate(&metadata("Bearer ops-secret")), Ok(Access::Granted { .. })));
    let open = Authenticator::disabled().vouched_by(Arc::new(Stub));
    let mut m = MetadataMap::new();
    m.insert("vouch", "ops".parse().unwrap());
    assert!(matches!(open.authenticate(&m), Ok(Access::Open)), "authentication off here");
}

#[test]
fn bearer_tokens_are_checked() {
    let auth = with_tokens();
    let code = |m: &MetadataMap| Status::from(auth.authenticate(m).unwrap_err()).code();
    assert_eq!(code(&MetadataMap::new()), tonic::Code::Unauthenticated);
    assert_eq!(code(&metadata("Bearer wrong")), tonic::Code::Unauthenticated);
    assert_eq!(code(&metadata("Basic ops-secret")), tonic::Code::Unauthenticated);
    assert_eq!(code(&metadata("Bearer ")), tonic::Code::Unauthenticated);
    let Access::Granted { grant, .. } = auth.authenticate(&metadata("bearer  ops-secret ")).unwrap() else {
        panic!("not granted");
    };
    assert_eq!(grant.name, "ops");
    assert!(matches!(Authenticator::disabled().authenticate(&MetadataMap::new()), Ok(Access::Open)));
}

#[test]
fn a_reload_takes_the_new_file_or_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    let entry = |token: &str| format!("[[token]]\nname = \"a\"\ntoken = \"{token}\"\ntopics = [\"*\"]\n");
    std::fs::write(&path, entry("first")).unwrap();
    let auth = Authenticator::load(&path).unwrap();
    assert!(auth.authenticate(&metadata("Bearer first")).is_ok());
    std::fs::write(&path, entry("second")).unwrap();
    assert_eq!(auth.reload().unwrap(), 1);
    assert!(auth.authenticate(&metadata("Bearer first")).is_err());
    assert!(auth.authenticate(&metadata("Bearer second")).is_ok());
    std::fs::write(&path, "not toml [").unwrap();
    assert!(auth.reload().is_err());
    assert!(auth.authenticate(&metadata("Bearer second")).is_ok(), "a bad file leaves the tokens in use");
}

#[test]
fn access_checks_topics() {
    let tokens = tokens();
    let live = Arc::new(RwLock::new(Arc::new(tokens)));
    let grant = live.read().unwrap().find("orders-secret").unwrap();
    let orders = Access::Granted { grant, live };
    assert!(orders.check("orders.paid").is_ok());
    let err = orders.check("payments").unwrap_err();
    assert!(matches!(&err, Error::Forbidden { token, topic } if token == "orders" && topic == "payments"));
    assert_eq!(orders.scope().tenant.map(|t| t.as_str().to_owned()), Some("orders".into()));
    assert!(Access::Open.check("anything").is_ok() && Access::Open.scope().is_everything());
}

#[test]
fn a_call_without_an_access_check_is_refused() {
    let unchecked = Request::new(());
    assert!(matches!(Access::of(&unchecked), Err(Error::Unchecked)));
    let mut checked = Request::new(());
    let mut auth = Authenticator::disabled();
    checked = tonic::service::Interceptor::call(&mut auth, checked).unwrap();
    assert!(matches!(Access::of(&checked), Ok(Access::Open)), "authentication off still attaches Open");
}

#[test]
fn tokens_name_their_tenant_or_are_their_own() {
    let tokens = Tokens::parse(
        "[[token]]\nname = \"orders-2025\"\ntoken = \"old\"\ntopics = [\"orders.*\"]\ntenant = \"orders\"\n\
         [[token]]\nname = \"orders-2026\"\ntoken = \"new\"\ntopics = [\"orders.*\"]\ntenant = \"orders\"\n\
         [[token]]\nname = \"billing\"\ntoken = \"b\"\ntopics = [\"*\"]\n",
    )
    .unwrap();
    assert_eq!(tokens.find("old").unwrap().tenant(), "orders");
    assert_eq!(tokens.find("new").unwrap().tenant(), "orders", "a rotation keeps the messages");
    assert_eq!(tokens.find("b").unwrap().tenant(), "billing", "by default the name");
    let err = Tokens::parse("[[token]]\nname = \"my service\"\ntoken = \"s3cret\"\ntopics = [\"*\"]\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("tenant = "), "a name that cannot be a tenant says how to name one: {err}");
    let err =
        Tokens::parse("[[token]]\nname = \"a\"\ntoken = \"s3cret\"\ntopics = [\"*\"]\ntenant = \"a/b\"\n")
            .unwrap_err()
            .to_string();
    assert!(err.contains("contains '/'"), "{err}");
}

#[test]
fn a_reload_reaches_access_already_handed_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    let entry = |topics: &str| format!("[[token]]\nname = \"a\"\ntoken = \"first\"\ntopics = [{topics}]\n");
    std::fs::write(&path, entry("\"orders.*\"")).unwrap();
    let auth = Authenticator::load(&path).unwrap();
    let access = auth.authenticate(&metadata("Bearer first")).unwrap();
    assert!(access.current().unwrap().check("billing").is_err());
    std::fs::write(&path, entry("\"orders.*\", \"billing\"")).unwrap();
    auth.reload().unwrap();
    assert!(access.current().unwrap().check("billing").is_ok(), "a widened grant applies at once");
    std::fs::write(&path, "[[token]]\nname = \"b\"\ntoken = \"second\"\ntopics = [\"*\"]\n").unwrap();
    auth.reload().unwrap();
    let err = access.current().unwrap_err();
    assert!(matches!(&err, Error::Revoked { .. }) && err.to_string().contains("revoked"), "{err}");
    assert!(Access::Open.current().is_ok());
}
