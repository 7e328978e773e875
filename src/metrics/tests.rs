use super::*;

fn metrics() -> Arc<Metrics> {
    let resolver: ModelResolver = Box::new(|m: &str| {
        let m = m.to_lowercase();
        (m.starts_with("gpt-4o")).then(|| "gpt-4o*".to_string())
    });
    Arc::new(Metrics::new(resolver).unwrap())
}

/// The value of the sample `series` (name with its labels, as exported) in `text`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn every_name_is_exported_with_help() {
    let m = metrics();
    m.tokens(
        "gpt-4o",
        DialectLabel::Chat,
        &TokenCounts {
            client_prompt: Some(1),
            ..Default::default()
        },
    );
    m.set_calibration(&[("gpt-4o".into(), 1.1)]);
    drop(m.store_metrics(StoreBackend::Memory));
    m.upstream_counts("default", DialectLabel::Chat)
        .count(UpstreamOutcome::Answered);
    m.fallback("gpt-4o", "gpt-4.1");
    let _ = m.store_metrics(StoreBackend::Sqlite);
    let text = m.render();
    for name in names::ALL {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} missing:\n{text}"
        );
        assert!(name.starts_with("ctxgate_"));
    }
    assert!(text.contains("ctxgate_build_info{version=\""));
}

#[test]
fn a_timer_records_the_request_when_dropped() {
    let m = metrics();
    let started = Instant::now();
    {
        let mut t = m.start(Route::Chat, DialectLabel::Anthropic, started);
        t.set_stream(true);
        t.streaming();
        t.upstream_sent();
        t.first_byte(Instant::now());
        let text = m.render();
        assert_eq!(
            value(
                &text,
                "ctxgate_requests_in_flight{dialect=\"anthropic\",route=\"chat\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                "ctxgate_requests_in_flight{dialect=\"chat\",route=\"chat\"}"
            ),
            Some(0.0)
        );
        assert_eq!(value(&text, "ctxgate_active_streams"), Some(1.0));
        t.upstream_ended();
        t.set_status(200);
    }
    {
        // Dropped without a status: the client went away.
        let _t = m.start(Route::Passthrough, DialectLabel::NoDialect, Instant::now());
    }
    let text = m.render();
    assert_eq!(
        value(
            &text,
            "ctxgate_requests_in_flight{dialect=\"anthropic\",route=\"chat\"}"
        ),
        Some(0.0)
    );
    assert_eq!(value(&text, "ctxgate_active_streams"), Some(0.0));
    assert_eq!(
        value(
            &text,
            "ctxgate_requests_total{dialect=\"anthropic\",route=\"chat\",status=\"2xx\",stream=\"true\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_requests_total{dialect=\"none\",route=\"passthrough\",status=\"4xx\",stream=\"false\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_overhead_seconds_count{dialect=\"anthropic\",route=\"chat\"}"
        ),
        Some(1.0)
    );
    // No upstream: no overhead sample.
    assert_eq!(
        value(
            &text,
            "ctxgate_overhead_seconds_count{dialect=\"none\",route=\"passthrough\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_stream_first_byte_seconds_count{dialect=\"anthropic\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_stream_first_byte_seconds_count{dialect=\"chat\"}"
        ),
        Some(0.0)
    );
}

#[test]
fn models_outside_the_allowlist_are_other() {
    let m = metrics();
    assert_eq!(&*m.model_label("gpt-4o-2024-08-06"), "gpt-4o*");
    assert_eq!(&*m.model_label("GPT-4o"), "gpt-4o*");
    assert_eq!(&*m.model_label("my-secret-model"), OTHER);
    assert_eq!(&*m.model_label(&"x".repeat(5000)), OTHER);
    for i in 0..3000 {
        m.tokens(
            &format!("random-{i}"),
            DialectLabel::Chat,
            &TokenCounts {
                completion: Some(1),
                ..Default::default()
            },
        );
    }
    m.rewrite(
        DialectLabel::Chat,
        RewriteStrategy::Hybrid,
        RewriteOutcome::Cleared,
        "gpt-4o",
        70,
    );
    let text = m.render();
    assert_eq!(
        value(
            &text,
            "ctxgate_upstream_completion_tokens_total{dialect=\"chat\",model=\"other\"}"
        ),
        Some(3000.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_saved_tokens_total{dialect=\"chat\",model=\"gpt-4o*\"}"
        ),
        Some(70.0)
    );
    assert!(!text.contains("random-"));
    assert_eq!(
        value(
            &text,
            "ctxgate_rewrites_total{dialect=\"chat\",outcome=\"cleared\",strategy=\"hybrid\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn calibration_is_averaged_per_label() {
    let m = metrics();
    m.set_calibration(&[
        ("gpt-4o".into(), 1.0),
        ("gpt-4o-mini".into(), 1.2),
        ("llama".into(), 0.9),
    ]);
    let text = m.render();
    let v = value(&text, "ctxgate_token_estimate_ratio{model=\"gpt-4o*\"}").unwrap();
    assert!((v - 1.1).abs() < 1e-9, "{v}");
    assert_eq!(
        value(&text, "ctxgate_token_estimate_ratio{model=\"other\"}"),
        Some(0.9)
    );
}

#[test]
fn store_and_session_handles() {
    let m = metrics();
    let s = m.store_metrics(StoreBackend::Sqlite);
    s.observe(StoreOp::Write, Instant::now(), true);
    s.observe(StoreOp::Load, Instant::now(), false);
    StoreMetrics::default().observe(StoreOp::Load, Instant::now(), false);
    let c = m.session_metrics();
    c.lookup(CacheResult::Hit);
    c.lookup(CacheResult::Hit);
    c.lookup(CacheResult::Miss);
    SessionMetrics::default().lookup(CacheResult::Miss);
    m.set_session_cache(3, 4096);
    let text = m.render();
    assert_eq!(
        value(
            &text,
            "ctxgate_store_operation_duration_seconds_count{backend=\"sqlite\",operation=\"write\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_store_errors_total{backend=\"sqlite\",operation=\"load\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "ctxgate_session_cache_lookups_total{result=\"hit\"}"),
        Some(2.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_session_cache_lookups_total{result=\"miss\"}"
        ),
        Some(1.0)
    );
    assert_eq!(value(&text, "ctxgate_sessions_cached"), Some(3.0));
    assert_eq!(value(&text, "ctxgate_session_cache_bytes"), Some(4096.0));
}

#[test]
fn summary_recall_and_errors() {
    let m = metrics();
    m.summary_call(SummaryOutcome::Timeout, Duration::from_millis(30));
    m.precompaction_started();
    m.precompaction_finished();
    m.recall_call(
        DialectLabel::Chat,
        RecallTool::Search,
        RecallOutcome::NotFound,
    );
    m.recall_round(DialectLabel::Chat);
    m.upstream_error(
        Route::Chat,
        DialectLabel::Chat,
        UpstreamErrorClass::Interrupted,
    );
    let text = m.render();
    assert_eq!(
        value(&text, "ctxgate_summarizer_calls_total{outcome=\"timeout\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "ctxgate_summarizer_call_duration_seconds_count"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "ctxgate_precompactions_started_total"),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "ctxgate_precompactions_finished_total"),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_recall_calls_total{dialect=\"chat\",outcome=\"not_found\",tool=\"search\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&text, "ctxgate_recall_rounds_total{dialect=\"chat\"}"),
        Some(1.0)
    );
    assert_eq!(
        value(
            &text,
            "ctxgate_upstream_errors_total{class=\"interrupted\",dialect=\"chat\",route=\"chat\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn latency_buckets_cover_overhead_and_long_calls() {
    assert!(LATENCY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
    assert!(LATENCY_BUCKETS.contains(&0.005));
    const { assert!(LATENCY_BUCKETS[0] <= 0.0001) };
    const { assert!(LATENCY_BUCKETS[LATENCY_BUCKETS.len() - 1] >= 600.0) };
}

#[test]
fn rejections_are_counted_by_route_dialect_and_reason() {
    let m = metrics();
    // A different count for every series, so that a mixed-up index shows.
    let mut n = 0;
    for route in Route::ALL {
        for dialect in DialectLabel::ALL {
            for reason in RejectReason::ALL {
                n += 1;
                for _ in 0..n {
                    m.rejected(*route, *dialect, *reason);
                }
            }
        }
    }
    let text = m.render();
    let mut n = 0;
    for route in Route::ALL {
        for dialect in DialectLabel::ALL {
            for reason in RejectReason::ALL {
                n += 1;
                let series = format!(
                    "ctxgate_requests_rejected_total{{dialect=\"{}\",reason=\"{}\",route=\"{}\"}}",
                    dialect.as_str(),
                    reason.as_str(),
                    route.as_str()
                );
                // Conversations are refused in their dialect for either reason; other `/v1/*` requests only for
                // overload; admin requests never. Impossible combinations get no series, even when recorded.
                let possible = match route {
                    Route::Chat => *dialect != DialectLabel::NoDialect,
                    Route::Passthrough => {
                        *dialect == DialectLabel::NoDialect && *reason == RejectReason::Overloaded
                    }
                    Route::Admin => false,
                };
                assert_eq!(
                    value(&text, &series),
                    possible.then_some(f64::from(n)),
                    "{series}:\n{text}"
                );
            }
        }
    }
}

#[test]
fn unmanaged_requests_are_counted_by_dialect_and_reason() {
    let m = metrics();
    // A different count for every series, so that a mixed-up index shows.
    let mut n = 0;
    for dialect in DialectLabel::ALL {
        for reason in UnmanagedReason::ALL {
            n += 1;
            for _ in 0..n {
                m.unmanaged(*dialect, *reason);
            }
        }
    }
    let text = m.render();
    let mut n = 0;
    for dialect in DialectLabel::ALL {
        for reason in UnmanagedReason::ALL {
            n += 1;
            let series = format!(
                "ctxgate_unmanaged_requests_total{{dialect=\"{}\",reason=\"{}\"}}",
                dialect.as_str(),
                reason.as_str()
            );
            // Only the Responses API keeps a conversation upstream.
            let possible = *dialect == DialectLabel::Responses;
            assert_eq!(
                value(&text, &series),
                possible.then_some(f64::from(n)),
                "{series}:\n{text}"
            );
        }
    }
    assert_eq!(
        UnmanagedReason::ALL
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>(),
        ["previous_response_id", "conversation", "compaction_trigger"]
    );
}

/// Every per-request family keeps the dialects apart: a different count per dialect shows a mixed-up index.
#[test]
fn per_request_series_are_split_by_dialect() {
    let m = metrics();
    for (k, dialect) in DialectLabel::ALL.iter().enumerate() {
        let times = k as u64 + 1;
        for _ in 0..times {
            let mut t = m.start(Route::Chat, *dialect, Instant::now());
            t.set_status(200);
            t.set_stream(true);
            t.upstream_sent();
            t.first_byte(Instant::now());
            drop(t);
            m.rewrite(
                *dialect,
                RewriteStrategy::Prune,
                RewriteOutcome::Pruned,
                "gpt-4o",
                10,
            );
            m.recall_call(*dialect, RecallTool::Recall, RecallOutcome::Found);
            m.recall_round(*dialect);
            m.upstream_error(Route::Chat, *dialect, UpstreamErrorClass::Timeout);
            m.tokens(
                "gpt-4o",
                *dialect,
                &TokenCounts {
                    client_prompt: Some(100),
                    upstream_prompt: Some(90),
                    upstream_cached: Some(60),
                    completion: Some(5),
                },
            );
        }
    }
    let text = m.render();
    for (k, dialect) in DialectLabel::ALL.iter().enumerate() {
        let times = (k + 1) as f64;
        let d = dialect.as_str();
        for (series, want) in [
            (
                format!("ctxgate_requests_total{{dialect=\"{d}\",route=\"chat\",status=\"2xx\",stream=\"true\"}}"),
                times,
            ),
            (
                format!("ctxgate_request_duration_seconds_count{{dialect=\"{d}\",route=\"chat\"}}"),
                times,
            ),
            (
                format!("ctxgate_upstream_duration_seconds_count{{dialect=\"{d}\",route=\"chat\"}}"),
                times,
            ),
            (
                format!("ctxgate_stream_first_byte_seconds_count{{dialect=\"{d}\"}}"),
                times,
            ),
            (
                format!("ctxgate_rewrites_total{{dialect=\"{d}\",outcome=\"pruned\",strategy=\"prune\"}}"),
                times,
            ),
            (
                format!("ctxgate_saved_tokens_total{{dialect=\"{d}\",model=\"gpt-4o*\"}}"),
                10.0 * times,
            ),
            (
                format!("ctxgate_upstream_cached_tokens_total{{dialect=\"{d}\",model=\"gpt-4o*\"}}"),
                60.0 * times,
            ),
            (
                format!("ctxgate_recall_calls_total{{dialect=\"{d}\",outcome=\"found\",tool=\"recall\"}}"),
                times,
            ),
            (
                format!("ctxgate_recall_rounds_total{{dialect=\"{d}\"}}"),
                times,
            ),
            (
                format!("ctxgate_upstream_errors_total{{class=\"timeout\",dialect=\"{d}\",route=\"chat\"}}"),
                times,
            ),
            (
                format!("ctxgate_client_prompt_tokens_total{{dialect=\"{d}\",model=\"gpt-4o*\"}}"),
                100.0 * times,
            ),
            (
                format!("ctxgate_upstream_prompt_tokens_total{{dialect=\"{d}\",model=\"gpt-4o*\"}}"),
                90.0 * times,
            ),
            (
                format!("ctxgate_upstream_completion_tokens_total{{dialect=\"{d}\",model=\"gpt-4o*\"}}"),
                5.0 * times,
            ),
            (
                format!("ctxgate_requests_in_flight{{dialect=\"{d}\",route=\"chat\"}}"),
                0.0,
            ),
        ] {
            // A conversation always has a dialect: `none` was recorded above but has no series.
            let want = (*dialect != DialectLabel::NoDialect).then_some(want);
            assert_eq!(value(&text, &series), want, "{series}");
        }
    }
}

/// A rare combination (a 3xx answer) gets its series when it first occurs; an impossible one (a rewrite under
/// strategy `off`) never, even when recorded.
#[test]
fn rare_series_appear_when_they_occur_and_impossible_ones_never() {
    let m = metrics();
    let redirect =
        "ctxgate_requests_total{dialect=\"none\",route=\"passthrough\",status=\"3xx\",stream=\"false\"}";
    let before = m.render();
    assert_eq!(value(&before, redirect), None);
    assert!(!before.contains("status=\"3xx\""), "{before}");
    let mut t = m.start(Route::Passthrough, DialectLabel::NoDialect, Instant::now());
    t.set_status(301);
    drop(t);
    m.rewrite(
        DialectLabel::Chat,
        RewriteStrategy::Off,
        RewriteOutcome::Truncated,
        "gpt-4o",
        0,
    );
    let after = m.render();
    assert_eq!(value(&after, redirect), Some(1.0));
    assert!(!after.contains("strategy=\"off\""), "{after}");
}
