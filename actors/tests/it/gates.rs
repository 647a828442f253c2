//! Negative tests of every gate: each refusal names the role and the field.

use actors::model::{
    CacheGroupKind, CacheGroupSpec, GateError, GateProblem, HandoffSide, Location, ModelSpec, Role, VLLM_VERSIONS,
    VllmVersion, check_pairing, check_rank,
};
use actors::units::{Blocks, Bytes, Tokens};
use sim_core::SimDuration;

use crate::model_fixtures::*;

/// Asserts that `err` is about `field` of a `role` rank and that its text
/// says both; returns the text.
fn assert_names(err: &GateError, role: Role, field: &str) -> String {
    let text = err.to_string();
    assert_eq!(err.role, role, "{text}");
    assert_eq!(err.field(), field, "{text}");
    assert!(text.starts_with(&format!("{role} rank: ")), "role missing: {text}");
    assert!(text.contains(field), "field {field} missing: {text}");
    text
}

fn refuse(spec: &ModelSpec, role: Role) -> GateError {
    spec.validate(role).expect_err("the gate refuses this model")
}

/// The GLM spec with group `index` changed by `f`.
fn glm_with(index: usize, f: impl FnOnce(&mut CacheGroupSpec)) -> ModelSpec {
    let mut s = glm_spec();
    f(&mut s.cache_groups[index]);
    s
}

#[test]
fn linear_xor_grouped() {
    let mut both = glm_spec();
    both.kv_bytes_per_token = Some(Bytes::new(32_768));
    let err = refuse(&both, Role::Prefill);
    assert_eq!(err.problem, GateProblem::BothLinearAndGrouped);
    let text = assert_names(&err, Role::Prefill, "cache_groups");
    assert!(text.contains("kv_bytes_per_token"), "{text}");

    let err = refuse(&ModelSpec::default(), Role::Decode);
    assert_eq!(err.problem, GateProblem::NeitherLinearNorGrouped);
    let text = assert_names(&err, Role::Decode, "cache_groups");
    assert!(text.contains("kv_bytes_per_token"), "{text}");

    let err = refuse(&linear_spec(0), Role::Aggregated);
    assert_eq!(err.problem, GateProblem::Zero { field: "kv_bytes_per_token" });
    assert_eq!(
        assert_names(&err, Role::Aggregated, "kv_bytes_per_token"),
        "aggregated rank: kv_bytes_per_token must be greater than 0"
    );
}

#[test]
fn missing_markers() {
    let err = refuse(&glm_with(2, |g| g.transfer_bytes_per_block = None), Role::Decode);
    assert_eq!(
        assert_names(&err, Role::Decode, "transfer_bytes_per_block"),
        r#"decode rank: cache_groups[2] "kda 0": missing field transfer_bytes_per_block"#
    );
    assert_eq!(err.location, Location::Group { index: 2, name: "kda 0".into() });

    let err = refuse(&glm_with(1, |g| g.prefix_cacheable = None), Role::Prefill);
    assert_eq!(
        assert_names(&err, Role::Prefill, "prefix_cacheable"),
        r#"prefill rank: cache_groups[1] "tail ring": missing field prefix_cacheable"#
    );
}

#[test]
fn zero_counts() {
    type Edit = fn(&mut CacheGroupSpec);
    let cases: [(&str, Edit); 3] = [
        ("block_size_tokens", |g| g.block_size_tokens = Tokens::ZERO),
        ("page_bytes", |g| g.page_bytes = Bytes::ZERO),
        ("transfer_bytes_per_block", |g| g.transfer_bytes_per_block = Some(Bytes::ZERO)),
    ];
    for (field, f) in cases {
        let err = refuse(&glm_with(0, f), Role::Prefill);
        assert_eq!(err.problem, GateProblem::Zero { field });
        let text = assert_names(&err, Role::Prefill, field);
        assert!(text.contains(r#"cache_groups[0] "full attention""#), "{text}");
    }
}

#[test]
fn transfer_larger_than_page() {
    let err = refuse(&glm_with(3, |g| g.transfer_bytes_per_block = Some(Bytes::new(GLM_PAGE + 1))), Role::Decode);
    let text = assert_names(&err, Role::Decode, "transfer_bytes_per_block");
    assert!(text.contains("page_bytes"), "{text}");
    // Equal to the page is fine (the full-attention group).
    assert!(glm_spec().validate(Role::Decode).is_ok());
}

#[test]
fn window_fields() {
    // A window kind without a window.
    for kind in [CacheGroupKind::SlidingWindow, CacheGroupKind::Convolution] {
        let s = spec(vec![fa("fa", 16, 100), CacheGroupSpec { window_tokens: None, kind, ..window("w", 1, 16, 100) }]);
        let err = refuse(&s, Role::Decode);
        assert_eq!(err.problem, GateProblem::Missing { field: "window_tokens" });
        assert_names(&err, Role::Decode, "window_tokens");
    }
    // A zero window.
    let s = spec(vec![window("w", 0, 16, 100)]);
    let err = refuse(&s, Role::Prefill);
    assert_eq!(err.problem, GateProblem::Zero { field: "window_tokens" });
    assert_names(&err, Role::Prefill, "window_tokens");
    // A window on a kind without one.
    let err = refuse(&glm_with(0, |g| g.window_tokens = Some(Tokens::new(128))), Role::Prefill);
    assert!(matches!(err.problem, GateProblem::NotAllowed { field: "window_tokens", .. }));
    assert_names(&err, Role::Prefill, "window_tokens");
}

#[test]
fn checkpoint_blocks_only_on_mamba_state() {
    // On full attention.
    let err = refuse(&glm_with(0, |g| g.checkpoint_blocks = Some(Blocks::new(1))), Role::Prefill);
    assert!(matches!(err.problem, GateProblem::NotAllowed { field: "checkpoint_blocks", .. }));
    assert_names(&err, Role::Prefill, "checkpoint_blocks");
    // On a tail ring (a state that is not prefix cacheable).
    let err = refuse(&glm_with(1, |g| g.checkpoint_blocks = Some(Blocks::new(1))), Role::Decode);
    let text = assert_names(&err, Role::Decode, "checkpoint_blocks");
    assert!(text.contains("tail ring"), "{text}");
    // Zero is as good as absent.
    assert!(glm_with(1, |g| g.checkpoint_blocks = Some(Blocks::ZERO)).validate(Role::Decode).is_ok());
}

#[test]
fn cross_group_checks() {
    // Duplicate names.
    let err = refuse(&glm_with(3, |g| g.name = "kda 0".into()), Role::Prefill);
    assert_eq!(err.problem, GateProblem::DuplicateName { first: 2 });
    let text = assert_names(&err, Role::Prefill, "name");
    assert!(text.contains("cache_groups[3]") && text.contains("cache_groups[2]"), "{text}");

    // Full-attention groups with different block sizes.
    let s = spec(vec![fa("fa 0", 16, 100), window("w", 128, 32, 100), fa("fa 1", 32, 100)]);
    let err = refuse(&s, Role::Decode);
    assert_eq!(err.problem, GateProblem::FullAttentionBlockSize { this: 32, first: 16, first_index: 0 });
    let text = assert_names(&err, Role::Decode, "block_size_tokens");
    assert!(text.contains(r#"cache_groups[2] "fa 1""#), "{text}");
    // A window group with its own block size is fine.
    assert!(spec(vec![fa("fa 0", 16, 100), window("w", 128, 32, 100)]).validate(Role::Decode).is_ok());

    // Groups with different pages.
    let s = spec(vec![fa("fa", 16, 100), fa("fa 2", 16, 200)]);
    let err = refuse(&s, Role::Aggregated);
    let text = assert_names(&err, Role::Aggregated, "page_bytes");
    assert!(text.contains("200") && text.contains("100"), "{text}");
}

#[test]
fn grouped_handoff_ranks_need_a_supported_version() {
    let m = glm();
    for role in [Role::Prefill, Role::Decode] {
        let err = check_rank(role, &m, None).unwrap_err();
        let text = assert_names(&err, role, "vllm_version");
        assert!(text.contains("0.31.0") && text.contains("0.32.0"), "{text}");

        let err = check_rank(role, &m, Some("0.30.0")).unwrap_err();
        let text = assert_names(&err, role, "vllm_version");
        assert!(text.contains("\"0.30.0\""), "{text}");
        assert_eq!(
            text,
            format!(
                r#"{role} rank: vllm_version "0.30.0" is not supported for a grouped {role} rank (supported: 0.31.0, 0.32.0, 0.33.0)"#
            )
        );
        // "v0.32.0" is not "0.32.0": versions match exactly.
        assert!(check_rank(role, &m, Some("v0.32.0")).is_err());

        // Every release holds a source under vLLM's 30 s lease.
        for v in ["0.31.0", "0.32.0", "0.33.0"] {
            let rules = check_rank(role, &m, Some(v)).unwrap();
            assert_eq!(rules.version.map(|r| r.version), Some(v));
            assert_eq!(rules.source_lease(), SimDuration::from_secs(30));
        }
    }
}

#[test]
fn aggregated_and_linear_ranks_and_versions() {
    let m = glm();
    // A grouped aggregated rank moves nothing: no version needed ...
    let rules = check_rank(Role::Aggregated, &m, None).unwrap();
    assert!(rules.version.is_none());
    assert_eq!(rules.source_lease(), SimDuration::from_secs(30));
    // ... but a version it names must be known.
    let err = check_rank(Role::Aggregated, &m, Some("0.99.0")).unwrap_err();
    assert_names(&err, Role::Aggregated, "vllm_version");
    assert!(check_rank(Role::Aggregated, &m, Some("0.33.0")).unwrap().version.is_some());

    // A linear rank takes any version or none.
    let linear = model(&linear_spec(32_768));
    for role in [Role::Prefill, Role::Decode, Role::Aggregated] {
        assert!(check_rank(role, &linear, None).unwrap().version.is_none());
        assert!(check_rank(role, &linear, Some("0.20.2")).unwrap().version.is_none());
        assert_eq!(check_rank(role, &linear, Some("0.31.0")).unwrap().version.map(|v| v.version), Some("0.31.0"));
    }
}

#[test]
fn version_table_is_data() {
    let names: Vec<&str> = VLLM_VERSIONS.iter().map(|v| v.version).collect();
    assert_eq!(names, ["0.31.0", "0.32.0", "0.33.0"]);
    assert!(VLLM_VERSIONS.iter().all(|v| v.grouped_handoff));
    assert!(VLLM_VERSIONS.iter().all(|v| v.source_lease == SimDuration::from_secs(30)));
    // Each row says where it was read.
    assert!(VLLM_VERSIONS.iter().all(|v| v.source.contains(v.version) && v.source.contains("kv_lease_duration")));
    assert!(VllmVersion::find("0.34.0").is_none());
}

#[test]
fn pairing_refuses_linear_with_grouped() {
    let grouped = glm();
    let linear = model(&linear_spec(32_768));
    let err = check_pairing(&linear, &grouped).unwrap_err();
    let text = assert_names(&err, Role::Decode, "cache_groups");
    assert!(text.contains("grouped decode rank cannot pair with a linear prefill rank"), "{text}");
    let err = check_pairing(&grouped, &linear).unwrap_err();
    let text = assert_names(&err, Role::Decode, "cache_groups");
    assert!(text.contains("linear decode rank cannot pair with a grouped prefill rank"), "{text}");
}

#[test]
fn pairing_refuses_different_groups() {
    let prefill = glm();
    assert!(check_pairing(&prefill, &glm()).is_ok());

    // One group fewer.
    let mut fewer = glm_spec();
    fewer.cache_groups.pop();
    let err = check_pairing(&prefill, &model(&fewer)).unwrap_err();
    let text = assert_names(&err, Role::Decode, "cache_groups");
    assert!(text.contains("5 groups here, 6 on prefill"), "{text}");

    // Same count, one field differs.
    let decode = model(&glm_with(4, |g| g.transfer_bytes_per_block = Some(Bytes::new(GLM_KDA9))));
    let err = check_pairing(&prefill, &decode).unwrap_err();
    let text = assert_names(&err, Role::Decode, "cache_groups");
    assert!(
        text.contains(r#"cache_groups[4] "kda 2": transfer_bytes_per_block 9768960 here, 8683520 on prefill"#),
        "{text}"
    );
    let decode = model(&glm_with(1, |g| g.prefix_cacheable = Some(true)));
    let text = check_pairing(&prefill, &decode).unwrap_err().to_string();
    assert!(text.contains("prefix_cacheable true here, false on prefill"), "{text}");

    // Linear ranks must agree on their bytes per token.
    let err = check_pairing(&model(&linear_spec(32_768)), &model(&linear_spec(16_384))).unwrap_err();
    let text = assert_names(&err, Role::Decode, "kv_bytes_per_token");
    assert!(text.contains("16384") && text.contains("32768"), "{text}");
}

#[test]
fn handoff_commands_by_role() {
    assert!(Role::Prefill.accepts(HandoffSide::Source));
    assert!(!Role::Prefill.accepts(HandoffSide::Destination));
    assert!(Role::Decode.accepts(HandoffSide::Destination));
    assert!(!Role::Decode.accepts(HandoffSide::Source));
    assert!(!Role::Aggregated.accepts(HandoffSide::Source));
    assert!(!Role::Aggregated.accepts(HandoffSide::Destination));
    assert_eq!(Role::Aggregated.to_string(), "aggregated");
}
