use super::*;

#[test]
fn defaults_follow_the_design() {
    let c = Config::from_settings(Settings::default()).unwrap();
    assert_eq!(c.http, Some("127.0.0.1:8181".parse().unwrap()));
    assert_eq!(c.socket, PathBuf::from("/run/sandboxd/sandboxd.sock"));
    assert_eq!(c.max_sessions, 32);
    assert_eq!(c.session_ttl_s, 1800);
    assert_eq!(c.public_url, "http://127.0.0.1:8181");
    assert_eq!((c.token_max_sessions, c.token_max_runs), (16, 8));
    assert_eq!((c.max_connections, c.header_timeout_s, c.body_timeout_s), (256, 10, 30));
    assert_eq!((c.max_anonymous_connections, c.token_max_connections, c.send_timeout_s), (64, 64, 30));
    assert!(c.operator_tokens.is_empty());
}

#[test]
fn connection_limits_fit_inside_max_connections() {
    let s = Settings { max_connections: Some(10), ..Default::default() };
    let c = Config::from_settings(s).unwrap();
    assert_eq!((c.max_anonymous_connections, c.token_max_connections), (3, 3));
    let s = Settings { max_connections: Some(10), token_max_connections: Some(11), ..Default::default() };
    let err = Config::from_settings(s).unwrap_err().to_string();
    assert!(err.contains("`token_max_connections`") && err.contains("1 to max_connections (10)"), "{err}");
    let s = Settings { max_anonymous_connections: Some(0), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`max_anonymous_connections`"));
    for bad in [0, 3601] {
        let s = Settings { send_timeout_s: Some(bad), ..Default::default() };
        assert!(Config::from_settings(s).unwrap_err().to_string().contains("`send_timeout_s`"));
    }
    let s = Settings { send_timeout_s: Some(5), ..Default::default() };
    assert_eq!(Config::from_settings(s).unwrap().send_timeout_s, 5);
}

#[test]
fn operator_tokens_are_tokens_of_their_own() {
    let s = Settings {
        http: Some("0.0.0.0:8181".into()),
        operator_tokens: Some(vec!["op".into(), "".into()]),
        ..Default::default()
    };
    let c = Config::from_settings(s).unwrap();
    assert_eq!(c.operator_tokens, ["op"]);
    assert!(!c.to_toml().contains("\"op\""));
    let s = Settings {
        tokens: Some(vec!["same".into()]),
        operator_tokens: Some(vec!["same".into()]),
        ..Default::default()
    };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`operator_tokens`"));
}

#[test]
fn per_token_quotas_fit_inside_max_sessions() {
    let s = Settings { max_sessions: Some(5), ..Default::default() };
    let c = Config::from_settings(s).unwrap();
    assert_eq!((c.token_max_sessions, c.token_max_runs), (3, 2));
    let s = Settings { max_sessions: Some(5), token_max_sessions: Some(6), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`token_max_sessions`"));
    let s = Settings { header_timeout_s: Some(0), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`header_timeout_s`"));
    let s = Settings { max_connections: Some(0), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`max_connections`"));
}

#[test]
fn mcp_session_limits_default_and_are_checked() {
    let c = Config::from_settings(Settings::default()).unwrap();
    assert_eq!((c.mcp_max_sessions, c.token_mcp_max_sessions, c.mcp_session_idle_s), (256, 128, 300));
    let s = Settings { mcp_max_sessions: Some(5), ..Default::default() };
    assert_eq!(Config::from_settings(s).unwrap().token_mcp_max_sessions, 3);
    for bad in [
        Settings { mcp_max_sessions: Some(0), ..Default::default() },
        Settings { mcp_max_sessions: Some(10_001), ..Default::default() },
    ] {
        assert!(Config::from_settings(bad).unwrap_err().to_string().contains("`mcp_max_sessions`"));
    }
    let s = Settings { mcp_max_sessions: Some(5), token_mcp_max_sessions: Some(6), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`token_mcp_max_sessions`"));
    let s = Settings { token_mcp_max_sessions: Some(0), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`token_mcp_max_sessions`"));
    let s = Settings { mcp_session_idle_s: Some(0), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`mcp_session_idle_s`"));
    let file = "mcp_max_sessions = 9\ntoken_mcp_max_sessions = 2\nmcp_session_idle_s = 60\n";
    let parsed: Settings = toml::from_str(file).unwrap();
    let c = Config::from_settings(parsed).unwrap();
    assert_eq!((c.mcp_max_sessions, c.token_mcp_max_sessions, c.mcp_session_idle_s), (9, 2, 60));
}

#[test]
fn flags_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sandboxd.toml");
    std::fs::write(&file, "max_sessions = 7\nsession_ttl_s = 9\n").unwrap();
    let cli = Settings { config: Some(file), max_sessions: Some(5), ..Default::default() };
    let c = Config::load(cli).unwrap();
    assert_eq!((c.max_sessions, c.session_ttl_s), (5, 9));
}

#[test]
fn a_named_config_file_must_exist_and_parse() {
    let cli = Settings { config: Some("/nonexistent/sandboxd.toml".into()), ..Default::default() };
    assert!(Config::load(cli).unwrap_err().to_string().contains("/nonexistent/sandboxd.toml"));
}

#[test]
fn metrics_listen_is_off_by_default_and_checked() {
    assert_eq!(Config::from_settings(Settings::default()).unwrap().metrics_listen, None);
    let s = Settings { metrics_listen: Some("127.0.0.1:9464".into()), ..Default::default() };
    assert_eq!(Config::from_settings(s).unwrap().metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    let s = Settings { metrics_listen: Some("nonsense".into()), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`metrics_listen`"));
}

#[test]
fn non_loopback_http_needs_tokens() {
    let s = Settings { http: Some("0.0.0.0:8181".into()), ..Default::default() };
    let err = Config::from_settings(s).unwrap_err().to_string();
    assert!(err.contains("`http`") && err.contains("tokens"), "{err}");
    let s = Settings { http: Some("0.0.0.0:8181".into()), tokens: Some(vec!["t".into()]), ..Default::default() };
    assert!(Config::from_settings(s).is_ok());
}

#[test]
fn bad_values_name_the_key() {
    let s = Settings { http: Some("nonsense".into()), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`http`"));
    let s = Settings { log_format: Some("xml".into()), ..Default::default() };
    assert!(Config::from_settings(s).unwrap_err().to_string().contains("`log_format`"));
    assert!(toml::from_str::<Settings>("nope = 1").is_err());
}

#[test]
fn tokens_are_not_printed() {
    let s = Settings { tokens: Some(vec!["secret".into()]), ..Default::default() };
    let text = Config::from_settings(s).unwrap().to_toml();
    assert!(!text.contains("secret"));
}

#[test]
fn the_chat_endpoint_is_checked_and_its_key_not_printed() {
    let default = Config::from_settings(Settings::default()).unwrap();
    assert_eq!(default.llm_url.as_deref(), Some("http://127.0.0.1:1234/v1"));
    assert_eq!((default.llm_timeout_s, default.chat_max_turns, default.llm_images), (300, 10, false));
    let off = Config::from_settings(Settings { llm_url: Some("off".into()), ..Default::default() }).unwrap();
    assert_eq!(off.llm_url, None);
    assert!(off.to_toml().contains("llm_url = \"off\""));
    for (bad, says) in
        [("", "http://"), ("localhost:1234/v1", "http://"), ("http://user:pw@127.0.0.1:1234/v1", "credentials")]
    {
        let e = Config::from_settings(Settings { llm_url: Some(bad.into()), ..Default::default() }).unwrap_err();
        assert!(e.to_string().contains("`llm_url`") && e.to_string().contains(says), "{bad}: {e}");
    }
    for turns in [0, 101] {
        let e = Config::from_settings(Settings { chat_max_turns: Some(turns), ..Default::default() }).unwrap_err();
        assert!(e.to_string().contains("`chat_max_turns`"), "{e}");
    }
    let keyed = Settings { llm_api_key: Some("sk-very-secret".into()), ..Default::default() };
    let text = Config::from_settings(keyed).unwrap().to_toml();
    assert!(!text.contains("sk-very-secret") && text.contains("llm_api_key = \"********\""), "{text}");
}
