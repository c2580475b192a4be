//! The pool's bookkeeping and its errors' words, without a sandbox.

use super::state::PRIOR_FOOTPRINT;
use super::*;

/// A template taken counts as busy and running; once its run is over it is
/// recycling, due back, and given back it is neither.
#[test]
fn a_templates_run_is_counted_from_take_to_give_back() {
    let mut st = State::default();
    let t0 = tokio::time::Instant::now();
    let within = Duration::from_millis(50);
    assert_eq!(st.coming_back("p", t0, within), 0);
    st.taken("p", t0);
    assert_eq!((st.hits, st.busy["p"], st.running["p"].len(), st.count("p")), (1, 1, 1, 1));
    // A run younger than `within` is due back; an older one is not waited for.
    assert_eq!(st.coming_back("p", t0 + within / 2, within), 1);
    assert_eq!(st.coming_back("p", t0 + within * 2, within), 0);
    assert_eq!(st.coming_back("q", t0, within), 0);
    // The run is over: its template is recycled, due back within moments.
    *st.recycling.entry("p".into()).or_default() += 1;
    st.stop_running("p", t0);
    assert!(st.running["p"].is_empty());
    assert_eq!(st.coming_back("p", t0 + within * 2, within), 1);
    st.returned("p", true);
    assert_eq!((st.busy["p"], st.recycling["p"]), (0, 0));
    assert_eq!(st.coming_back("p", t0, within), 0);
    // A template that failed before its run is not counted as recycling; nothing
    // goes below zero, and another run's start is not taken for this one's.
    st.taken("p", t0);
    st.stop_running("p", t0 + within);
    assert_eq!(st.running["p"].len(), 1);
    st.stop_running("p", t0);
    st.returned("p", false);
    st.returned("p", true);
    assert_eq!((st.busy["p"], st.recycling["p"], st.hits), (0, 0, 2));
    // Handed to a run that gave up just then: as if never taken.
    st.taken("p", t0);
    st.untaken("p", t0);
    assert_eq!((st.busy["p"], st.running["p"].len(), st.hits), (0, 0, 2));
}

/// Runs in line are counted until they give up; the memory held is each policy's
/// templates at its measured footprint (a prior before one is measured).
#[test]
fn waiting_runs_and_held_memory_are_counted_as_they_stand() {
    let mut st = State::default();
    let t0 = tokio::time::Instant::now();
    let (tx1, rx1) = oneshot::channel::<Taken>();
    let (tx2, _rx2) = oneshot::channel::<Taken>();
    st.waiters.entry("p".into()).or_default().extend([tx1, tx2]);
    assert_eq!(st.waiting("p"), 2);
    drop(rx1);
    assert_eq!((st.waiting("p"), st.waiting("q")), (1, 0));
    st.taken("p", t0);
    st.taken("q", t0);
    assert_eq!(st.held_bytes(), 2 * PRIOR_FOOTPRINT);
    st.demand("p", t0).footprint = Some(100 << 20);
    assert_eq!(st.held_bytes(), (100 << 20) + PRIOR_FOOTPRINT);
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
