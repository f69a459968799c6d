//! The dispatch policies' keys in the checkpoint CF: one per policy, by
//! its [`PolicyKey`] (the record is the policy room's [`TopicPolicy`]).

use super::POLICY_PREFIX;
use crate::policy::PolicyKey;

/// Where the policy of `key` is kept.
pub fn policy_key(key: &PolicyKey) -> Vec<u8> {
    let mut k = vec![POLICY_PREFIX];
    k.extend_from_slice(&key.encode());
    k
}

/// The first key of all policies.
pub fn policy_start() -> Vec<u8> {
    vec![POLICY_PREFIX]
}

/// The first key after every policy key.
pub fn policy_end() -> Vec<u8> {
    vec![POLICY_PREFIX + 1]
}

pub fn decode_policy_key(key: &[u8]) -> Option<PolicyKey> {
    PolicyKey::decode(key.strip_prefix(&[POLICY_PREFIX])?)
}
