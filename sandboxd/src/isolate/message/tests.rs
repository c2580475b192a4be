//! Each channel's messages pinned to their bytes on the wire.

use super::super::channel::{encode, parse, Channel};
use super::super::spec::Rlimits;
use super::*;

fn child() -> ChildSpec {
    ChildSpec {
        rlimits: Rlimits { file_size_bytes: 3, open_files: 4 },
        seccomp: crate::isolate::seccomp::Program::allow_all(),
        egress_port: None,
    }
}

/// `msg` encodes to exactly `wire` (plus the newline) and `wire` parses back.
fn exact<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(wire: &str, msg: T) {
    assert_eq!(encode(&msg).unwrap(), format!("{wire}\n").into_bytes());
    assert_eq!(parse::<T>(wire.as_bytes()).unwrap(), msg);
}

#[test]
fn slot_messages_keep_their_wire_form() {
    exact(
        r#"{"cgroup_procs":["/c/cgroup.procs"],"daemon_pid":7}"#,
        Prepare { cgroup_procs: vec!["/c/cgroup.procs".into()], daemon_pid: 7 },
    );
    exact(r#"{"event":"ready"}"#, SlotReply::Ready);
    exact(
        r#"{"event":"setup_failed","step":"s","error":"e"}"#,
        SlotReply::SetupFailed { step: "s".into(), error: "e".into() },
    );
    assert_eq!(RUN_BYTE, b"r");
}

#[test]
fn helper_messages_keep_their_wire_form() {
    exact(r#"{"event":"helper_started","pid":3}"#, Event::HelperStarted { pid: 3 });
    exact(r#"{"event":"started","init_pid":4}"#, Event::Started { init_pid: 4, listener: false });
    exact(r#"{"event":"started","init_pid":4,"listener":true}"#, Event::Started { init_pid: 4, listener: true });
    exact(r#"{"event":"attached"}"#, Event::Attached);
    exact(r#"{"event":"warning","message":"w"}"#, Event::Warning { message: "w".into() });
    exact(r#"{"event":"ended","exit":{"exited":-1}}"#, Event::Ended { exit: Exit::Exited(-1) });
    exact(r#"{"event":"ended","exit":{"signaled":9}}"#, Event::Ended { exit: Exit::Signaled(9) });
    exact(r#"{"event":"init_killed","signal":9}"#, Event::InitKilled { signal: 9 });
    exact(
        r#"{"event":"setup_failed","step":"mounts","error":"x"}"#,
        Event::SetupFailed { step: "mounts".into(), error: "x".into() },
    );
    exact(r#"{"event":"furnished"}"#, Event::Furnished { listener: false });
    exact(r#"{"event":"furnished","listener":true}"#, Event::Furnished { listener: true });
    // Only these two carry the egress listener, and only when they say so.
    assert!(Event::Started { init_pid: 1, listener: true }.carries_listener());
    assert!(Event::Furnished { listener: true }.carries_listener());
    assert!(!Event::Furnished { listener: false }.carries_listener() && !Event::Attached.carries_listener());
    // Each event's name is its tag.
    for e in [
        Event::HelperStarted { pid: 1 },
        Event::Started { init_pid: 1, listener: true },
        Event::Attached,
        Event::Furnished { listener: true },
        Event::Warning { message: "w".into() },
        Event::Ended { exit: Exit::KILLED },
        Event::InitKilled { signal: 9 },
        Event::SetupFailed { step: "s".into(), error: "e".into() },
    ] {
        let wire = serde_json::to_value(&e).unwrap();
        assert_eq!(wire["event"], e.name());
    }
    exact(
        r#"{"op":"attach","pid":12,"workspace":"/w","owner_uid":5,"owner_gid":6}"#,
        HelperRequest::Attach(Attach {
            pid: Some(12),
            workspace: "/w".into(),
            packages: None,
            owner_uid: 5,
            owner_gid: 6,
        }),
    );
    exact(
        r#"{"op":"attach","pid":12,"workspace":"/w","packages":"/p","owner_uid":5,"owner_gid":6}"#,
        HelperRequest::Attach(Attach {
            pid: Some(12),
            workspace: "/w".into(),
            packages: Some("/p".into()),
            owner_uid: 5,
            owner_gid: 6,
        }),
    );
    exact(r#"{"op":"furnish","pid":12}"#, HelperRequest::Furnish { pid: 12 });
    // A pid may be left out: the sandbox's own mount namespace.
    let a: HelperRequest = parse(br#"{"op":"attach","workspace":"/w","owner_uid":5,"owner_gid":6}"#).unwrap();
    assert!(matches!(a, HelperRequest::Attach(Attach { pid: None, .. })));
    for bad in [&br#"{"workspace":"/w","owner_uid":5,"owner_gid":6}"#[..], br#"{"op":"furnish"}"#, br#"{"op":"x"}"#] {
        assert!(parse::<HelperRequest>(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    for bad in [&br#"{"event":"ready"}"#[..], br#"{"event":"nope"}"#, br#"{"started":1}"#, b"{", b""] {
        assert!(parse::<Event>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn an_exit_has_one_wire_form_on_every_channel() {
    exact(r#"{"exited":3}"#, Exit::Exited(3));
    exact(r#"{"exited":-1}"#, Exit::Exited(-1));
    exact(r#"{"signaled":9}"#, Exit::Signaled(9));
    assert_eq!(Exit::KILLED, Exit::Signaled(libc::SIGKILL));
    assert_eq!((Exit::Exited(3).code(), Exit::Exited(3).signal()), (Some(3), None));
    assert_eq!((Exit::Signaled(11).code(), Exit::Signaled(11).signal()), (None, Some(11)));
    use nix::sys::wait::WaitStatus;
    let pid = nix::unistd::Pid::from_raw(2);
    assert_eq!(Exit::of(WaitStatus::Exited(pid, 70)), Some(Exit::Exited(70)));
    assert_eq!(Exit::of(WaitStatus::Signaled(pid, nix::sys::signal::SIGSEGV, true)), Some(Exit::Signaled(11)));
    assert_eq!(Exit::of(WaitStatus::StillAlive), None);
    for bad in [
        &br#"{"exited":3,"signaled":9}"#[..],
        br#"{"exited":"3"}"#,
        br#"{"exited":4294967296}"#,
        br#"{"killed":9}"#,
        br#""exited""#,
        br#"{"code":3}"#,
    ] {
        assert!(parse::<Exit>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn init_lines_keep_their_wire_form_and_are_written_through_a_fixed_buffer() {
    for (wire, msg) in [
        (r#"{"ended":{"exited":3}}"#, InitLine::Ended(Exit::Exited(3))),
        (r#"{"ended":{"signaled":9}}"#, InitLine::Ended(Exit::Signaled(9))),
        (r#"{"warning":"careful"}"#, InitLine::Warning("careful".into())),
        (
            r#"{"failed":{"step":"mounts","error":"bind /x: EPERM"}}"#,
            InitLine::Failed { step: "mounts".into(), error: "bind /x: EPERM".into() },
        ),
    ] {
        exact(wire, msg.clone());
        // What the init writes (a fixed buffer) is what serde makes of the line.
        assert_eq!(msg.encode(), format!("{wire}\n").into_bytes());
    }
    let f = Failure { step: "exec", error: "a\nb\t\"c\"".into() };
    let mut written = vec![];
    f.write(&mut written).unwrap();
    assert_eq!(written, b"{\"failed\":{\"step\":\"exec\",\"error\":\"a\\nb\\t\\\"c\\\"\"}}\n");
    assert_eq!(written, f.line().encode());
    assert_eq!(parse::<InitLine>(&written[..written.len() - 1]).unwrap(), f.line());
    assert_eq!(InitLine::Ended(Exit::Exited(3)).into_event(), Event::Ended { exit: Exit::Exited(3) });
    assert_eq!(
        InitLine::Failed { step: "s".into(), error: "e".into() }.into_event(),
        Event::SetupFailed { step: "s".into(), error: "e".into() }
    );
    for bad in [
        &b""[..],
        b"X 3",
        b"W careful",
        br#"{"ended":{"exited":3},"warning":"x"}"#,
        br#"{"failed":{"step":"s"}}"#,
        br#"{"failed":{"step":"s","error":"e","x":1}}"#,
        br#"{"ended":3}"#,
        br#"{"warning":null}"#,
        b"\xff",
    ] {
        assert!(parse::<InitLine>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn a_long_init_line_is_cut_to_fit_its_buffer_on_a_character_boundary() {
    // The worst case: every byte escaped to 6.
    for text in ["\u{1}".repeat(10_000), "é".repeat(10_000), "\"".repeat(10_000), "x".repeat(10_000)] {
        for msg in [InitLine::Warning(text.clone()), InitLine::Failed { step: text.clone(), error: text.clone() }] {
            let line = msg.encode();
            assert!(line.len() <= INIT_LINE_MAX && line.len() > INIT_LINE_MAX / 2, "{}", line.len());
            assert_eq!(line.last(), Some(&b'\n'));
            match parse::<InitLine>(&line[..line.len() - 1]).unwrap() {
                InitLine::Warning(m) => assert!(text.starts_with(&m) && !m.is_empty()),
                InitLine::Failed { step, error } => {
                    assert!(text.starts_with(&step) && text.starts_with(&error) && !error.is_empty());
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(fit("aé", 2), "a");
    assert_eq!(fit("aé", 3), "aé");
    assert_eq!(fit("\n\n", 11), "\n");
}

#[test]
fn template_messages_are_what_the_runner_sends_and_reads() {
    // sandboxd_runner.py: json.dumps({"ready": {"failed": failed}}) and {"reaped": pid}.
    exact(r#"{"ready":{"failed":["nope"]}}"#, TemplateMessage::Ready { failed: vec!["nope".into()] });
    exact(r#"{"reaped":12}"#, TemplateMessage::Reaped(12));
    assert_eq!(
        parse::<TemplateMessage>(br#"{"ready": {"failed": []}}"#).unwrap(),
        TemplateMessage::Ready { failed: vec![] }
    );
    // The runner reads json.loads(data)["spec"] and hands it to sandboxd_enter.
    let req = encode(&ForkRequest { spec: child() }).unwrap();
    assert_eq!(
        String::from_utf8(req).unwrap(),
        "{\"spec\":{\"rlimits\":{\"file_size_bytes\":3,\"open_files\":4},\"seccomp\":\"BgAAAAAA/38=\"}}\n"
    );
    for bad in [&br#"{"reaped":"x"}"#[..], br#"{"ready":{}}"#, br#"{"forked":1}"#, b"null"] {
        assert!(parse::<TemplateMessage>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn a_pooled_runs_messages_are_what_the_runner_sends_and_reads() {
    // sandboxd_runner.py sends b'{"entered": true}\n', then
    // json.dumps({"exit_code": exit_code}); it reads msg["code"], ["run_id"], ["autosave"].
    assert_eq!(parse::<ForkMessage>(br#"{"entered": true}"#).unwrap(), ForkMessage::Entered(true));
    // Before it, sandboxd_enter asks for the fork's own filesystems, and is answered.
    exact(r#"{"furnish":true}"#, ForkMessage::Furnish(true));
    exact(r#"{"furnished":true}"#, ForkReply::Furnished(true));
    assert_eq!(parse::<RunClaim>(br#"{"exit_code": 255}"#).unwrap(), RunClaim::ExitCode(255));
    exact(r#"{"exit_code":0}"#, RunClaim::ExitCode(0));
    // ... and applies msg["env"] to its environment.
    let mut env = std::collections::BTreeMap::new();
    let code = RunCode { code: "print(1)\n", run_id: "r1", autosave: true, env: &env, kernel: false };
    assert_eq!(encode(&code).unwrap(), b"{\"code\":\"print(1)\\n\",\"run_id\":\"r1\",\"autosave\":true,\"env\":{}}\n");
    env.insert("API_KEY".to_string(), "sandboxd-placeholder-1".to_string());
    let code = RunCode { code: "", run_id: "r1", autosave: false, env: &env, kernel: false };
    assert_eq!(
        encode(&code).unwrap(),
        b"{\"code\":\"\",\"run_id\":\"r1\",\"autosave\":false,\"env\":{\"API_KEY\":\"sandboxd-placeholder-1\"}}\n"
    );
    // A kernel's: msg.get("kernel") makes the fork run `code` (kernel.py) as the kernel.
    let code = RunCode { code: "k", run_id: "kernel-s", autosave: false, env: &env, kernel: true };
    assert_eq!(
        encode(&code).unwrap(),
        b"{\"code\":\"k\",\"run_id\":\"kernel-s\",\"autosave\":false,\"env\":{\"API_KEY\":\"sandboxd-placeholder-1\"},\"kernel\":true}\n"
    );
    exact(r#"{"ended":{"exited":-1}}"#, Report::Ended(Exit::Exited(-1)));
    exact(r#"{"ended":{"signaled":9}}"#, Report::Ended(Exit::Signaled(9)));
    for bad in [&br#"{"exit_code":0}"#[..], br#"{"signal":9}"#, br#"{"ended":{"exited":0},"failed":{}}"#] {
        assert!(parse::<Report>(bad).unwrap_err().is_violation(), "{}", String::from_utf8_lossy(bad));
    }
    exact(r#"{"failed":{"step":"s","error":"e"}}"#, Report::Failed { step: "s".into(), error: "e".into() });
    // What the user's code could write instead is none of the claims.
    for bad in [
        &br#"{"failed":{"step":"x","error":"evil"}}"#[..],
        br#"{"signal":9}"#,
        br#"{"ended":{"exited":0}}"#,
        br#"{"exit_code":256}"#,
        br#"{"exit_code":-1}"#,
        br#"{"exit_code":0,"signal":9}"#,
        br#"{"entered":true}"#,
    ] {
        assert!(parse::<RunClaim>(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    for bad in [&br#"{"failed":{"step":"x","error":"evil"}}"#[..], br#"{"entered":true,"x":1}"#, br#""entered""#] {
        assert!(parse::<ForkMessage>(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn kernel_messages_are_what_kernel_py_sends_and_reads() {
    // kernel.py: json.dumps(obj, ensure_ascii=False), with its default separators.
    assert_eq!(parse::<KernelMessage>(br#"{"kind": "ready"}"#).unwrap(), KernelMessage::Ready {});
    assert_eq!(
        parse::<KernelMessage>(
            "{\"kind\": \"chunk\", \"nonce\": \"n\", \"stream\": \"stdout\", \"text\": \"é\"}".as_bytes()
        )
        .unwrap(),
        KernelMessage::Chunk { nonce: "n".into(), stream: Stream::Stdout, text: "é".into() }
    );
    let env = std::collections::BTreeMap::from([("K".to_string(), "v".to_string())]);
    let cell = KernelCell { code: "1", run_id: "r", autosave: false, output_limit: 10, nonce: "n", env: &env };
    assert_eq!(
        encode(&cell).unwrap(),
        b"{\"code\":\"1\",\"run_id\":\"r\",\"autosave\":false,\"output_limit\":10,\"nonce\":\"n\",\"env\":{\"K\":\"v\"}}\n"
    );
    assert_eq!(kernel_source("abc"), b"0000000003abc");
    assert!(parse::<KernelMessage>(br#"{"kind":"nope"}"#).unwrap_err().is_violation());
}

#[tokio::test]
async fn a_channel_sends_and_receives_typed_lines_and_refuses_the_rest() {
    let (a, b) = tokio::net::UnixStream::pair().unwrap();
    let (mut a, mut b) = (Channel::new(a, 64), Channel::new(b, 64));
    a.send(&Event::Attached).await.unwrap();
    a.send(&Event::Ended { exit: Exit::Exited(2) }).await.unwrap();
    assert_eq!(b.recv::<Event>().await.unwrap(), Some(Event::Attached));
    assert_eq!(b.recv::<Event>().await.unwrap(), Some(Event::Ended { exit: Exit::Exited(2) }));
    // An unknown tag: a typed error, and the channel is out of step from then on.
    use tokio::io::AsyncWriteExt;
    a.get_mut().write_all(b"{\"event\":\"evil\"}\n").await.unwrap();
    assert!(b.recv::<Event>().await.unwrap_err().is_violation());
    assert!(matches!(b.recv::<Event>().await, Err(Error::Broken)));
    // An oversized line costs the limit and is refused.
    let (c, d) = tokio::net::UnixStream::pair().unwrap();
    let (mut c, mut d) = (Channel::new(c, 64), Channel::new(d, 64));
    c.send(&Event::Warning { message: "x".repeat(100) }).await.unwrap();
    assert!(matches!(d.recv::<Event>().await, Err(Error::TooLong(64))));
    drop(c);
    // A clean end of the stream is None.
    let (e, f) = tokio::net::UnixStream::pair().unwrap();
    drop(e);
    assert_eq!(Channel::new(f, 64).recv::<Event>().await.unwrap(), None);
}

#[tokio::test]
async fn a_channel_passes_fds_with_its_message() {
    use std::io::{Read, Write};
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let a = Channel::new(tokio::net::UnixStream::from_std(a).unwrap(), 1024);
    let (r, w) = super::super::process::pipe().unwrap();
    a.send_with_fds(&ForkRequest { spec: child() }, &[w.as_fd()]).await.unwrap();
    drop(w);
    let got = tokio::task::spawn_blocking(move || {
        let fds = super::super::channel::recv_fds::<5>(b.as_fd(), &[1]).unwrap().unwrap();
        let mut pipe = std::fs::File::from(fds.into_iter().next().unwrap());
        pipe.write_all(b"through").unwrap();
    })
    .await;
    assert!(got.is_ok());
    let mut text = String::new();
    std::fs::File::from(r).read_to_string(&mut text).unwrap();
    assert_eq!(text, "through");
}
