//! The pool's bookkeeping and its errors' words, without a sandbox.

use super::*;

/// A template taken counts as busy and running; once its run is over it is
/// recycling, back soon, and given back it is neither.
#[test]
fn a_templates_run_is_counted_from_take_to_give_back() {
    let mut st = State::default();
    let t0 = tokio::time::Instant::now();
    assert!(!st.back_soon("p", t0));
    st.taken("p", t0);
    assert_eq!((st.hits, st.busy["p"], st.running["p"].len()), (1, 1, 1));
    // A run younger than SHORT_RUN may be back soon; an older one is not waited for.
    assert!(st.back_soon("p", t0 + SHORT_RUN / 2));
    assert!(!st.back_soon("p", t0 + SHORT_RUN * 2));
    assert!(!st.back_soon("q", t0));
    // The run is over: its template is recycled, back within moments.
    *st.recycling.entry("p".into()).or_default() += 1;
    st.stop_running("p", t0);
    assert!(st.running["p"].is_empty());
    assert!(st.back_soon("p", t0 + SHORT_RUN * 2));
    st.returned("p", true);
    assert_eq!((st.busy["p"], st.recycling["p"]), (0, 0));
    assert!(!st.back_soon("p", t0));
    // A template that failed before its run is not counted as recycling; nothing
    // goes below zero, and another run's start is not taken for this one's.
    st.taken("p", t0);
    st.stop_running("p", t0 + SHORT_RUN);
    assert_eq!(st.running["p"].len(), 1);
    st.stop_running("p", t0);
    st.returned("p", false);
    st.returned("p", true);
    assert_eq!((st.busy["p"], st.recycling["p"], st.hits), (0, 0, 2));
}

/// What `GET /v1/health` shows for each (its words are the operator's clue).
#[test]
fn each_start_error_says_what_went_wrong() {
    let said = [
        Error::Start(isolate::Error::HelperGone),
        Error::ImportsTimedOut(READY_TIMEOUT),
        Error::Protocol(isolate::channel::Error::TooLong(65536)),
        Error::EndedBeforeReady,
        Error::NoLibrary,
        Error::FirstFork(isolate::Error::Setup { step: "fork".into(), error: "EAGAIN".into() }),
    ]
    .map(|e| e.to_string());
    assert_eq!(
        said,
        [
            "the sandbox helper closed its control socket before the program ended",
            "its imports took longer than 300 s",
            "it broke the protocol: a line longer than 65536 bytes",
            "the interpreter ended before it was ready",
            "no pool library",
            "its first fork failed: setting up the sandbox failed at fork: EAGAIN",
        ]
    );
}
