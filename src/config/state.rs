//! The "last good config" bookkeeping of a file-based source, free of I/O:
//! feed it file texts, ask it for [`Desired`].

use std::collections::BTreeMap;

use super::build::Builder;
use super::model::Document;
use super::parse::parse_documents;
use super::types::{ConfigError, Desired, FileStatus};

/// Files by name (built in name order), each with its last good documents,
/// plus the [`Builder`] that remembers last good registries.
#[derive(Debug, Default)]
pub struct ConfigState {
    files: BTreeMap<String, FileState>,
    source_error: Option<String>,
    builder: Builder,
    /// The warnings of the last [`ConfigState::desired`]: unknown or
    /// ignored fields, clamped values (logged, not errors).
    warnings: Vec<String>,
}

#[derive(Debug, Default)]
struct FileState {
    /// The text last seen, to skip re-parsing an unchanged file.
    text: Option<String>,
    /// The documents of the last version that parsed.
    good: Option<Vec<Document>>,
    /// Why the current version is not in force, if it is not.
    error: Option<ConfigError>,
}

impl ConfigState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Build with `builder` (e.g. one with a lower refresh floor).
    pub fn with_builder(builder: Builder) -> Self {
        ConfigState { builder, ..Self::default() }
    }

    /// Record the current text of `file`. A version that does not parse
    /// leaves the file's last good documents in force. Returns whether
    /// anything changed.
    pub fn set_file(&mut self, file: &str, text: String) -> bool {
        let state = self.files.entry(file.to_owned()).or_default();
        if state.text.as_ref() == Some(&text) {
            return false;
        }
        match parse_documents(file, &text) {
            Ok(docs) => {
                state.good = Some(docs);
                state.error = None;
            }
            Err(e) => state.error = Some(e),
        }
        state.text = Some(text);
        true
    }

    /// Record that `file` exists but could not be read. Its last good
    /// documents stay in force. Returns whether anything changed.
    pub fn set_file_error(&mut self, file: &str, error: ConfigError) -> bool {
        let state = self.files.entry(file.to_owned()).or_default();
        let changed = state.text.is_some() || state.error.as_ref().map(ToString::to_string) != Some(error.to_string());
        state.text = None;
        state.error = Some(error);
        changed
    }

    /// The warnings of the last [`ConfigState::desired`], each naming its
    /// object and field.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The documents in force, file by file (duplicates included).
    pub fn documents(&self) -> impl Iterator<Item = &Document> {
        self.files.values().flat_map(|f| f.good.iter().flatten())
    }

    /// Forget `file` and its documents. Returns whether it was known.
    pub fn remove_file(&mut self, file: &str) -> bool {
        self.files.remove(file).is_some()
    }

    /// Names of the files currently known, in order.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }

    /// A problem with the source as a whole (say, its directory became
    /// unreadable); everything known stays in force. Returns whether it changed.
    pub fn set_source_error(&mut self, error: Option<ConfigError>) -> bool {
        let error = error.map(|e| format!("{e}; keeping last good config"));
        let changed = self.source_error != error;
        self.source_error = error;
        changed
    }

    /// Build what the files currently say, falling back to last good
    /// documents and registries where the current ones are broken.
    pub fn desired(&mut self) -> Desired {
        // An object given twice is reported with both files; only the first
        // (in file order) reaches the builder.
        let mut first_seen: BTreeMap<(&'static str, String, String), &str> = BTreeMap::new();
        let mut duplicates = Vec::new();
        let mut docs = Vec::new();
        for (file, f) in &self.files {
            for doc in f.good.iter().flatten() {
                let (kind, ns, name) = match doc {
                    Document::McpBridge(b) => ("McpBridge", &b.namespace, &b.name),
                    Document::Secret(s) => ("Secret", &s.namespace, &s.name),
                    Document::Ingress(i) => ("Ingress", &i.namespace, &i.name),
                };
                match first_seen.get(&(kind, ns.clone(), name.clone())) {
                    Some(first) => duplicates.push(format!(
                        "{kind} {ns}/{name}: defined more than once ({first} and {file}), ignoring all but the first"
                    )),
                    None => {
                        first_seen.insert((kind, ns.clone(), name.clone()), file);
                        docs.push(doc);
                    }
                }
            }
        }
        let built = self.builder.build_reporting(docs);
        self.warnings = built.warnings;
        let mut desired = built.desired;
        desired.errors.splice(0..0, duplicates);
        desired.files = self
            .files
            .iter()
            .map(|(name, f)| FileStatus {
                name: name.clone(),
                state: match (&f.error, &f.good) {
                    (None, _) => "loaded",
                    (Some(_), Some(_)) => "lastGoodKept",
                    (Some(_), None) => "ignored",
                },
                error: f.error.as_ref().map(ToString::to_string),
            })
            .collect();
        let file_errors = self.files.values().filter_map(|f| {
            let e = f.error.as_ref()?;
            Some(if f.good.is_some() {
                format!("{e}; keeping last good config of this file")
            } else {
                format!("{e}; file ignored")
            })
        });
        let file_errors =
            file_errors.map(|e| meshbridge_registries::clip_owned(e, meshbridge_registries::LOG_MESSAGE_MAX));
        let mut errors: Vec<String> = self.source_error.iter().cloned().chain(file_errors).collect();
        errors.append(&mut desired.errors);
        desired.errors = errors;
        desired
    }
}
