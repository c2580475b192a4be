//! [`super::drive`] over a socket pair, its signals recorded: no root, no sandbox.

use super::*;
use nix::sys::signal::Signal;
use std::sync::{Arc, Mutex};

type Sent = Arc<Mutex<Vec<(i32, Signal)>>>;

/// A sandbox as `drive` sees it, and the helper's end of its control socket.
fn launched() -> (Launched, std::os::unix::net::UnixStream) {
    let (ours, theirs) = socket_pair().unwrap();
    let launched = Launched {
        control: Some(Channel::new(FdStream::new(ours), HELPER_LINE)),
        stdout: None,
        stderr: None,
        helper_pid: None,
        init_pid: None,
        warnings: vec![],
        listener: None,
    };
    (launched, theirs)
}

/// The helper says these, in order.
fn say(helper: &mut std::os::unix::net::UnixStream, events: &[Event]) {
    for e in events {
        channel::write_line(helper, e).unwrap();
    }
}

fn bounds(timeout_ms: u64, grace_ms: u64) -> Bounds {
    Bounds {
        id: "r".into(),
        timeout: Duration::from_millis(timeout_ms),
        grace: Duration::from_millis(grace_ms),
        output_limit: 10,
    }
}

/// A kill that records what it would send.
fn recorder() -> (impl Kill, Sent) {
    let sent: Sent = Default::default();
    let log = sent.clone();
    (move |pid: i32, sig: Signal| log.lock().unwrap().push((pid, sig)), sent)
}

async fn run(sandbox: &mut Launched, b: Bounds, kill: impl Kill) -> Result<Ended, Error> {
    let (_cancel_tx, mut cancel) = watch::channel(false);
    drive(sandbox, &b, None, &mut cancel, Instant::now(), None, None, kill).await
}

#[tokio::test]
async fn a_program_that_ends_in_time_is_reported_as_it_ended_and_nothing_is_signalled() {
    let (mut sandbox, mut helper) = launched();
    say(
        &mut helper,
        &[
            Event::HelperStarted { pid: 222 },
            Event::Started { init_pid: 111, listener: false },
            Event::Warning { message: "careful".into() },
            Event::Ended { exit: Exit::Exited(3) },
        ],
    );
    let (kill, sent) = recorder();
    let ended = run(&mut sandbox, bounds(60_000, 1000), kill).await.unwrap();
    assert_eq!(ended.exit, Exit::Exited(3));
    assert!(!ended.timed_out && !ended.cancelled && ended.init_started.is_some());
    assert_eq!(ended.warnings, ["careful"]);
    assert_eq!((sandbox.init_pid, sandbox.helper_pid), (Some(111), Some(222)));
    assert!(sent.lock().unwrap().is_empty());
    // An init killed before it said how the program ended: that signal.
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::Started { init_pid: 111, listener: false }, Event::InitKilled { signal: 11 }]);
    let ended = run(&mut sandbox, bounds(60_000, 1000), recorder().0).await.unwrap();
    assert_eq!(ended.exit, Exit::Signaled(11));
}

#[tokio::test]
async fn at_its_limit_a_run_is_asked_to_stop_then_killed_and_timed_out() {
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::HelperStarted { pid: 222 }, Event::Started { init_pid: 111, listener: false }]);
    // The helper reports the program's end once the init was killed.
    let (killed_tx, killed_rx) = std::sync::mpsc::channel::<()>();
    let sent: Sent = Default::default();
    let log = sent.clone();
    let kill = move |pid: i32, sig: Signal| {
        log.lock().unwrap().push((pid, sig));
        if sig == Signal::SIGKILL {
            let _ = killed_tx.send(());
        }
    };
    let reporter = std::thread::spawn(move || {
        if killed_rx.recv_timeout(Duration::from_secs(10)).is_ok() {
            say(&mut helper, &[Event::Ended { exit: Exit::KILLED }]);
        }
        helper
    });
    let began = Instant::now();
    let ended = run(&mut sandbox, bounds(50, 100), kill).await.unwrap();
    assert!(began.elapsed() >= Duration::from_millis(150), "{:?}", began.elapsed());
    reporter.join().unwrap();
    assert_eq!(*sent.lock().unwrap(), [(111, Signal::SIGTERM), (111, Signal::SIGKILL)]);
    assert!(ended.timed_out && !ended.cancelled);
    assert_eq!(ended.exit, Exit::KILLED);
}

#[tokio::test]
async fn a_program_that_ends_within_its_grace_is_not_killed() {
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::Started { init_pid: 111, listener: false }]);
    let (asked_tx, asked_rx) = std::sync::mpsc::channel::<()>();
    let sent: Sent = Default::default();
    let log = sent.clone();
    let kill = move |pid: i32, sig: Signal| {
        log.lock().unwrap().push((pid, sig));
        let _ = asked_tx.send(());
    };
    let reporter = std::thread::spawn(move || {
        if asked_rx.recv_timeout(Duration::from_secs(10)).is_ok() {
            say(&mut helper, &[Event::Ended { exit: Exit::Exited(143) }]);
        }
        helper
    });
    let ended = run(&mut sandbox, bounds(20, 60_000), kill).await.unwrap();
    reporter.join().unwrap();
    assert_eq!(*sent.lock().unwrap(), [(111, Signal::SIGTERM)]);
    assert!(ended.timed_out);
    assert_eq!(ended.exit, Exit::Exited(143));
}

#[tokio::test]
async fn a_helper_that_goes_or_breaks_the_protocol_is_an_error_and_its_sandbox_is_killed() {
    // Gone without a word.
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::HelperStarted { pid: 222 }, Event::Started { init_pid: 111, listener: false }]);
    drop(helper);
    let (kill, sent) = recorder();
    let e = run(&mut sandbox, bounds(60_000, 1000), kill).await.unwrap_err();
    assert!(matches!(e, Error::HelperGone), "{e}");
    assert_eq!(*sent.lock().unwrap(), [(111, Signal::SIGKILL), (222, Signal::SIGKILL)]);

    // A line that is no event.
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::Started { init_pid: 111, listener: false }]);
    std::io::Write::write_all(&mut helper, b"{\"event\":\"exited\",\"code\":0}\n").unwrap();
    let (kill, sent) = recorder();
    let e = run(&mut sandbox, bounds(60_000, 1000), kill).await.unwrap_err();
    assert!(matches!(e, Error::HelperProtocol(_)), "{e}");
    assert_eq!(*sent.lock().unwrap(), [(111, Signal::SIGKILL)]);

    // An event out of place.
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::Started { init_pid: 111, listener: false }, Event::Attached]);
    let e = run(&mut sandbox, bounds(60_000, 1000), recorder().0).await.unwrap_err();
    assert_eq!(e.to_string(), "the sandbox helper said \"attached\" where it was to say how the program ended");

    // A sandbox that could not be built.
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::SetupFailed { step: "mounts".into(), error: "EPERM".into() }]);
    let e = run(&mut sandbox, bounds(60_000, 1000), recorder().0).await.unwrap_err();
    assert_eq!(e.to_string(), "setting up the sandbox failed at mounts: EPERM");

    // Gone after the daemon killed it: killed, not an error.
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::Started { init_pid: 111, listener: false }]);
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(helper);
    });
    let ended = run(&mut sandbox, bounds(10, 0), recorder().0).await.unwrap();
    closer.join().unwrap();
    assert!(ended.timed_out);
    assert_eq!(ended.exit, Exit::KILLED);
}

#[tokio::test]
async fn a_pooled_run_that_reports_its_own_end_has_the_rest_killed() {
    let mut run_ = Launched {
        control: None,
        stdout: None,
        stderr: None,
        helper_pid: None,
        init_pid: Some(111),
        warnings: vec![],
        listener: None,
    };
    let (kill, sent) = recorder();
    let (_tx, mut cancel) = watch::channel(false);
    let done: Done<'_> = Box::pin(async { Some(Exit::Exited(0)) });
    let b = bounds(60_000, 1000);
    let ended = drive(&mut run_, &b, None, &mut cancel, Instant::now(), None, Some(done), kill).await.unwrap();
    assert_eq!(ended.exit, Exit::Exited(0));
    assert_eq!(*sent.lock().unwrap(), [(111, Signal::SIGKILL)]);
    // Its report ended without a word: its processes are gone, killed.
    let (kill, _) = recorder();
    let done: Done<'_> = Box::pin(async { None });
    let ended = drive(&mut run_, &b, None, &mut cancel, Instant::now(), None, Some(done), kill).await.unwrap();
    assert_eq!(ended.exit, Exit::KILLED);
}

#[tokio::test]
async fn a_cancel_kills_the_run_and_says_so() {
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::Started { init_pid: 111, listener: false }]);
    let (kill, sent) = recorder();
    let (cancel_tx, mut cancel) = watch::channel(false);
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        let _ = cancel_tx.send(true);
        std::thread::sleep(Duration::from_millis(50));
        say(&mut helper, &[Event::Ended { exit: Exit::KILLED }]);
        helper
    });
    let b = bounds(60_000, 1000);
    let ended = drive(&mut sandbox, &b, None, &mut cancel, Instant::now(), None, None, kill).await.unwrap();
    closer.join().unwrap();
    assert!(ended.cancelled && !ended.timed_out);
    assert_eq!(ended.exit, Exit::KILLED);
    assert_eq!(*sent.lock().unwrap(), [(111, Signal::SIGKILL)]);
}

/// A cancel that comes before the helper has said which process is the
/// sandbox's init (a DELETE right after a run was accepted) once killed
/// nothing, and the run went on to its end.
#[tokio::test]
async fn a_cancel_before_the_init_is_known_still_kills_it() {
    let (ours, theirs) = socket_pair().unwrap();
    let init = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let pid = init.id() as i32;
    let mut sandbox = Launched {
        control: Some(Channel::new(FdStream::new(ours), HELPER_LINE)),
        stdout: None,
        stderr: None,
        helper_pid: None,
        init_pid: None,
        warnings: vec![],
        listener: None,
    };
    let (cancel_tx, mut cancel) = watch::channel(false);
    cancel_tx.send(true).unwrap();
    // The helper's side: the init started; its end is reported once it died
    // (it stays a zombie of this test until waited for), or after 10 s.
    let helper = tokio::spawn(async move {
        theirs.set_nonblocking(true).unwrap();
        let mut control = Channel::new(tokio::net::UnixStream::from_std(theirs).unwrap(), HELPER_LINE);
        control.send(&Event::Started { init_pid: pid, listener: false }).await.unwrap();
        let dead = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
                .unwrap_or(true)
        };
        for _ in 0..100 {
            if dead() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        control.send(&Event::Ended { exit: Exit::KILLED }).await.unwrap();
    });
    let bounds = Bounds { id: "r".into(), timeout: Duration::from_secs(60), grace: Duration::ZERO, output_limit: 10 };
    let signal = super::super::process::signal;
    let ended = drive(&mut sandbox, &bounds, None, &mut cancel, Instant::now(), None, None, signal).await.unwrap();
    helper.await.unwrap();
    assert!(ended.cancelled);
    let status = { init }.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "{status:?}");
}

/// A cold sandbox with network: its listener, sent with the helper's `started`,
/// goes to whoever launched it with the init's pid.
#[tokio::test]
async fn the_egress_listener_comes_with_the_start() {
    use std::os::fd::AsRawFd;
    let (mut sandbox, helper) = launched();
    let (r, w) = super::super::process::pipe().unwrap();
    let line = channel::encode(&Event::Started { init_pid: 111, listener: true }).unwrap();
    nix::sys::socket::sendmsg::<()>(
        helper.as_raw_fd(),
        &[std::io::IoSlice::new(&line)],
        &[nix::sys::socket::ControlMessage::ScmRights(&[w.as_raw_fd()])],
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .unwrap();
    drop(w);
    let mut helper = helper;
    say(&mut helper, &[Event::Ended { exit: Exit::Exited(0) }]);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (_cancel_tx, mut cancel) = watch::channel(false);
    let (kill, _) = recorder();
    let ended = drive(&mut sandbox, &bounds(60_000, 0), None, &mut cancel, Instant::now(), Some(tx), None, kill).await;
    assert_eq!(ended.unwrap().exit, Exit::Exited(0));
    let started = rx.await.unwrap();
    assert_eq!(started.init_pid, 111);
    // The very fd the helper sent: the pipe's write end.
    use std::io::{Read, Write};
    std::fs::File::from(started.listener.unwrap()).write_all(b"x").unwrap();
    let mut byte = [0u8; 1];
    std::fs::File::from(r).read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x");
}

/// A `started` that says a listener came with it, without one, is a failed set-up.
#[tokio::test]
async fn a_listener_line_without_its_fd_is_a_failed_setup() {
    let (mut sandbox, mut helper) = launched();
    say(&mut helper, &[Event::Started { init_pid: 111, listener: true }]);
    let (kill, _) = recorder();
    let e = run(&mut sandbox, bounds(60_000, 0), kill).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "setting up the sandbox failed at egress: the helper said it sent the egress listener, and none came"
    );
}
