use super::*;

fn chunk(nonce: &str, stream: Stream, text: &str) -> KernelMessage {
    KernelMessage::Chunk { nonce: nonce.into(), stream, text: text.into() }
}

fn reply(nonce: &str) -> KernelMessage {
    KernelMessage::Reply {
        nonce: nonce.into(),
        result: None,
        exception: None,
        exit_code: 0,
        stdout_truncated: false,
        stderr_truncated: false,
    }
}

#[test]
fn messages_round_trip_and_nothing_else_parses() {
    let all = [
        KernelMessage::Ready {},
        chunk("n", Stream::Stderr, "é\n"),
        KernelMessage::Reply {
            nonce: "n".into(),
            result: Some(Rich { plain: "1".into(), html: Some("<b>1</b>".into()) }),
            exception: Some(Exception { name: "E".into(), value: "v".into(), traceback: "t".into() }),
            exit_code: 3,
            stdout_truncated: true,
            stderr_truncated: false,
        },
    ];
    for m in all {
        let line = serde_json::to_vec(&m).unwrap();
        assert_eq!(channel::parse::<KernelMessage>(&line).unwrap(), m);
    }
    assert_eq!(
        channel::parse::<KernelMessage>(br#"{"kind":"reply","nonce":"n","result":{"text/plain":"2"},"exception":null,"exit_code":0,"stdout_truncated":false,"stderr_truncated":false}"#).unwrap(),
        KernelMessage::Reply { nonce: "n".into(), result: Some(Rich { plain: "2".into(), html: None }), exception: None, exit_code: 0, stdout_truncated: false, stderr_truncated: false }
    );
    for bad in [
        &br#"{"kind":"ready","x":1}"#[..],
        br#"{"kind":"chunk","nonce":"n","stream":"stdin","text":""}"#,
        br#"{"kind":"chunk","nonce":"n","stream":"stdout","text":"","more":1}"#,
        br#"{"kind":"reply","nonce":"n","result":null,"exception":null,"exit_code":256,"stdout_truncated":false,"stderr_truncated":false}"#,
        br#"{"kind":"reply","nonce":"n","result":{"text/plain":"1","x":2},"exception":null,"exit_code":0,"stdout_truncated":false,"stderr_truncated":false}"#,
        br#"{"stream":"stdout","run_id":"r","text":"old protocol"}"#,
        br#"{"failed":{"step":"x","error":"evil"}}"#,
        b"[]",
    ] {
        let e = channel::parse::<KernelMessage>(bad).unwrap_err();
        assert!(e.is_violation(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn other_cells_messages_are_dropped_and_a_reply_ends_only_its_own_cell() {
    let mut cell = Cell::new("now".into(), 100);
    assert_eq!(cell.take(chunk("before", Stream::Stdout, "late")), Ok(Step::Nothing));
    assert_eq!(cell.take(reply("before")), Ok(Step::Nothing));
    assert_eq!(
        cell.take(chunk("now", Stream::Stdout, "mine")),
        Ok(Step::Output(Chunk { stream: Stream::Stdout, text: "mine".into() }))
    );
    match cell.take(reply("now")) {
        Ok(Step::Reply(r)) => assert_eq!((r.stdout.as_str(), r.stdout_truncated), ("mine", false)),
        other => panic!("{other:?}"),
    }
    assert_eq!(cell.take(KernelMessage::Ready {}), Err(Unexpected));
}

#[test]
fn output_past_the_limit_is_dropped_and_marked() {
    let mut cell = Cell::new("n".into(), 10);
    assert!(matches!(cell.take(chunk("n", Stream::Stdout, "12345678")), Ok(Step::Output(_))));
    // 3 MiB in one forged chunk: 2 bytes kept, the rest dropped.
    let big = "x".repeat(3 << 20);
    assert_eq!(
        cell.take(chunk("n", Stream::Stdout, &big)),
        Ok(Step::Output(Chunk { stream: Stream::Stdout, text: "xx".into() }))
    );
    assert_eq!(cell.take(chunk("n", Stream::Stdout, "more")), Ok(Step::Nothing));
    // Multi-byte characters are not split; stderr has its own budget.
    assert!(matches!(cell.take(chunk("n", Stream::Stderr, "ééééé€")), Ok(Step::Output(_))));
    match cell.take(reply("n")) {
        Ok(Step::Reply(r)) => {
            assert_eq!((r.stdout.len(), r.stdout_truncated), (10, true));
            assert_eq!((r.stderr.as_str(), r.stderr_truncated), ("ééééé", true));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_replys_fields_are_clipped_and_its_truncation_claims_kept() {
    let mut cell = Cell::new("n".into(), 10);
    let long = "y".repeat(MAX_TEXT * 3);
    let msg = KernelMessage::Reply {
        nonce: "n".into(),
        result: Some(Rich { plain: long.clone(), html: Some(long.clone()) }),
        exception: Some(Exception { name: long.clone(), value: long.clone(), traceback: long }),
        exit_code: 1,
        stdout_truncated: true,
        stderr_truncated: false,
    };
    let Ok(Step::Reply(r)) = cell.take(msg) else { panic!() };
    let (res, exc) = (r.result.unwrap(), r.exception.unwrap());
    assert_eq!((res.plain.len(), res.html.unwrap().len()), (MAX_TEXT, MAX_TEXT));
    assert_eq!((exc.name.len(), exc.value.len(), exc.traceback.len()), (MAX_NAME, MAX_TEXT, MAX_TEXT));
    assert!(r.stdout_truncated && !r.stderr_truncated && r.exit_code == 1);
}

#[test]
fn the_bootstrap_reads_exactly_the_source() {
    let framed = kernel_source(SOURCE);
    assert_eq!(framed.len(), SOURCE.len() + 10);
    assert_eq!(std::str::from_utf8(&framed[..10]).unwrap().parse::<usize>().unwrap(), SOURCE.len());
    assert!(BOOTSTRAP.contains("_read(int(_read(10)))"));
}
