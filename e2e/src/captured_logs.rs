//! Every log line of a test binary, at debug level, in one buffer: for
//! tests that check what meshbridge logs (a WARN it must give, a secret it
//! must never print). The subscriber is global, not thread-local, because
//! watchers and streams log from every runtime thread; so a binary that uses
//! this captures every test's lines together.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

/// Install the capture (once per binary) and return the buffer.
pub fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = LogWriter(buf.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("no other subscriber in this binary");
        buf
    })
}

/// Everything captured so far, as text.
pub fn text() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

#[derive(Clone)]
struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
