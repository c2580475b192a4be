//! A session's conversations with the chat's LLM ([`crate::chat`]) on disk,
//! beside its run records: files in
//! `<state>/sessions/<key>/chats/` (root's, 0700; each 0600), one per
//! conversation, `<chat_id>.json`, written whole through a rename. They go when
//! the session goes.
//!
//! Bounds: a conversation is at most [`MAX_CHAT`] as stored (a tool result keeps
//! its first [`KEPT_TOOL_TEXT`] bytes; figures are kept as workspace paths, not
//! bytes); one that would grow past it is full, and the person is told to start
//! another. A session keeps at most [`MAX_CHATS`] conversations and [`MAX_BYTES`]
//! of them: the ones used longest ago go first when one is saved, never the one
//! being saved. So a session's conversations take at most [`RESERVE`] of disk,
//! which its storage reservation counts.

use crate::model::chat::{Chat, ChatMessage, ChatSummary};
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The directory of a session's conversations, in its session directory.
pub const DIR: &str = "chats";
/// Most conversations kept per session.
pub const MAX_CHATS: usize = 50;
/// Most bytes of conversations kept per session.
pub const MAX_BYTES: u64 = 4 * 1024 * 1024;
/// Largest conversation, as stored (JSON).
pub const MAX_CHAT: usize = 1024 * 1024;
/// Bytes of a tool result's text a conversation keeps (and shows the model again).
pub const KEPT_TOOL_TEXT: usize = 32 * 1024;
/// Room on disk a session's conversations may take.
pub const RESERVE: u64 = MAX_BYTES + MAX_CHAT as u64;

/// A chat id as the daemon makes them: 32 lowercase hex digits.
pub fn valid_chat_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A conversation that has no room for more.
#[derive(Debug, Clone, thiserror::Error)]
#[error("this conversation is full (a conversation keeps at most {} KiB): start a new conversation (omit chat_id)", MAX_CHAT / 1024)]
pub struct Full;

/// A session's conversations (see the module doc).
#[derive(Debug, Clone)]
pub struct Chats {
    dir: PathBuf,
}

impl Chats {
    /// The conversations of the session whose directory is `session_dir`.
    pub fn of(session_dir: &Path) -> Chats {
        Chats { dir: session_dir.join(DIR) }
    }

    /// Conversation files, used longest ago first: (modified, chat id, size).
    fn entries(&self) -> io::Result<Vec<(std::time::SystemTime, String, u64)>> {
        let read = match fs::read_dir(&self.dir) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(e),
        };
        let mut v: Vec<_> = read
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let id = name.strip_suffix(".json").filter(|id| valid_chat_id(id))?.to_string();
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, id, meta.len()))
            })
            .collect();
        v.sort();
        Ok(v)
    }

    /// Keep `chat` as it is now; then the session's oldest conversations go past
    /// the bounds. [`Full`] (as `InvalidData`'s source) when it does not fit.
    pub fn save(&self, chat: &Chat) -> io::Result<()> {
        let bytes = encode(chat)?;
        fs::DirBuilder::new().mode(0o700).recursive(true).create(&self.dir)?;
        crate::kept::write(&self.dir.join(format!("{}.json", chat.chat_id)), &bytes)?;
        self.prune(&chat.chat_id)
    }

    fn prune(&self, keep: &str) -> io::Result<()> {
        let files: Vec<(PathBuf, u64)> =
            self.entries()?.into_iter().map(|(_, id, size)| (self.dir.join(format!("{id}.json")), size)).collect();
        crate::kept::prune(&files, &self.dir.join(format!("{keep}.json")), MAX_CHATS, MAX_BYTES)
    }

    /// Conversation `chat_id`, if the session has it.
    pub fn get(&self, chat_id: &str) -> io::Result<Option<Chat>> {
        if !valid_chat_id(chat_id) {
            return Ok(None);
        }
        crate::kept::read(&self.dir.join(format!("{chat_id}.json")), MAX_CHAT, "a conversation")
    }

    /// Every conversation, used most recently first (one that cannot be read is
    /// logged and passed over).
    pub fn list(&self) -> io::Result<Vec<ChatSummary>> {
        let mut out = vec![];
        for (_, id, _) in self.entries()?.into_iter().rev() {
            match self.get(&id) {
                Ok(Some(c)) => out.push(ChatSummary {
                    messages: c.messages.len(),
                    chat_id: c.chat_id,
                    title: c.title,
                    created_at: c.created_at,
                    updated_at: c.updated_at,
                    model: c.model,
                }),
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "passing over an unreadable conversation")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

/// `chat` as stored: [`Full`] past [`MAX_CHAT`].
fn encode(chat: &Chat) -> io::Result<Vec<u8>> {
    let bytes = serde_json::to_vec(chat).map_err(io::Error::other)?;
    if bytes.len() > MAX_CHAT {
        return Err(io::Error::new(io::ErrorKind::InvalidData, Full));
    }
    Ok(bytes)
}

/// Whether `e` is a conversation that is [`Full`].
pub fn is_full(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Full>())
}

/// A tool result's text as kept: its first [`KEPT_TOOL_TEXT`] bytes, saying so
/// when that is less.
pub fn kept_tool_text(text: &str) -> String {
    if text.len() <= KEPT_TOOL_TEXT {
        return text.to_string();
    }
    let mut end = KEPT_TOOL_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[cut: the first {end} of {} bytes are kept; write long output to a file and read parts of it]",
        &text[..end],
        text.len()
    )
}

/// The start of `message`, as a conversation's title.
pub fn title_of(message: &str) -> String {
    let line = message.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let mut title: String = line.chars().take(80).collect();
    if title.len() < line.len() {
        title.push('…');
    }
    title
}

/// The messages the model is shown again: all but notices.
pub fn for_model(messages: &[ChatMessage]) -> impl Iterator<Item = &ChatMessage> {
    messages.iter().filter(|m| !matches!(m, ChatMessage::Notice { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(id: usize, text: &str) -> Chat {
        Chat {
            chat_id: format!("{id:032x}"),
            session_id: "s".into(),
            title: title_of(text),
            created_at: "t".into(),
            updated_at: "t".into(),
            model: None,
            messages: vec![ChatMessage::User { content: text.into(), at: "t".into() }],
        }
    }

    #[test]
    fn conversations_are_kept_0600_listed_newest_first_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let chats = Chats::of(dir.path());
        assert!(chats.list().unwrap().is_empty());
        for i in 0..3 {
            chats.save(&chat(i, &format!("hello {i}"))).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let listed: Vec<String> = chats.list().unwrap().into_iter().map(|c| c.title).collect();
        assert_eq!(listed, ["hello 2", "hello 1", "hello 0"]);
        let back = chats.get(&format!("{:032x}", 1)).unwrap().unwrap();
        assert_eq!(back, chat(1, "hello 1"));
        let mode = fs::metadata(dir.path().join(DIR).join(format!("{:032x}.json", 1))).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(fs::metadata(dir.path().join(DIR)).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(chats.get("../../etc/passwd").unwrap().is_none());
        assert!(chats.get(&format!("{:032x}", 9)).unwrap().is_none());
    }

    #[test]
    fn a_session_keeps_its_newest_conversations_within_the_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let chats = Chats::of(dir.path());
        for i in 0..(MAX_CHATS + 5) {
            chats.save(&chat(i, "x")).unwrap();
        }
        assert_eq!(chats.entries().unwrap().len(), MAX_CHATS);
        // Big ones: the byte bound, never the one saved.
        let big = "y".repeat(MAX_CHAT - 1024);
        for i in 100..110 {
            chats.save(&chat(i, &big)).unwrap();
            assert!(chats.get(&format!("{i:032x}")).unwrap().is_some());
        }
        let total: u64 = chats.entries().unwrap().iter().map(|e| e.2).sum();
        assert!(total <= MAX_BYTES, "{total}");
        // Past the size of one: full, and what was kept stays.
        let too_big = chat(100, &"z".repeat(MAX_CHAT));
        let e = chats.save(&too_big).unwrap_err();
        assert!(is_full(&e), "{e}");
        assert!(chats.get(&format!("{:032x}", 109)).unwrap().is_some());
    }

    #[test]
    fn titles_and_kept_tool_text_are_cut_at_character_boundaries() {
        assert_eq!(title_of("\n  plot a sine  \nmore"), "plot a sine");
        let long = "é".repeat(100);
        assert_eq!(title_of(&long).chars().count(), 81);
        let text = "é".repeat(KEPT_TOOL_TEXT);
        let kept = kept_tool_text(&text);
        assert!(kept.starts_with(&"é".repeat(KEPT_TOOL_TEXT / 2)));
        assert!(kept.contains(&format!("of {} bytes are kept", text.len())), "{}", &kept[kept.len() - 120..]);
        assert_eq!(kept_tool_text("short"), "short");
    }
}
