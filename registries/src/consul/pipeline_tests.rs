use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// An answer as Consul 1.8.7 sends it to a probe.
fn answer(index: u64) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nVary: Accept-Encoding\r\n\
         X-Consul-Effective-Consistency: leader\r\nX-Consul-Index: {index}\r\nX-Consul-Knownleader: true\r\n\
         X-Consul-Lastcontact: 0\r\nDate: Mon, 23 Nov 2026 18:00:00 GMT\r\nContent-Length: 2\r\n\r\n[]"
    )
}

fn parse_all(answers: &mut Answers) -> (Vec<u64>, Option<Oddity>) {
    let mut out = Vec::new();
    loop {
        match answers.next() {
            Ok(Some(index)) => out.push(index),
            Ok(None) => return (out, None),
            Err(odd) => return (out, Some(odd)),
        }
    }
}

#[test]
fn answers_split_anywhere_parse_the_same() {
    let bytes: String = (1..=5).map(answer).collect();
    for step in [1, 2, 3, 7, 50, 299, 1000] {
        let mut answers = Answers::default();
        let mut got = Vec::new();
        for chunk in bytes.as_bytes().chunks(step) {
            answers.feed(chunk);
            let (indexes, odd) = parse_all(&mut answers);
            assert_eq!(odd, None, "step {step}");
            got.extend(indexes);
        }
        assert_eq!(got, vec![1, 2, 3, 4, 5], "step {step}");
        assert_eq!(answers.pending(), 0);
        assert_eq!(answers.body_bytes, 10);
    }
}

#[test]
fn a_partial_body_waits_for_the_rest() {
    let mut answers = Answers::default();
    let one = answer(7);
    answers.feed(&one.as_bytes()[..one.len() - 1]);
    assert_eq!(answers.next(), Ok(None));
    answers.feed(b"]");
    assert_eq!(answers.next(), Ok(Some(7)));
}

#[test]
fn oddities_end_the_batch() {
    let cases: [(&str, Oddity); 9] = [
        ("HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n", Oddity::Status(429)),
        ("HTTP/1.1 403 Forbidden\r\nX-Consul-Index: 3\r\nContent-Length: 17\r\n\r\nACL not found", Oddity::Status(403)),
        ("HTTP/1.1 200 OK\r\nConnection: close\r\nX-Consul-Index: 3\r\nContent-Length: 2\r\n\r\n[]", Oddity::Close),
        (
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nX-Consul-Index: 3\r\nContent-Length: 2\r\n\r\n[]",
            Oddity::Close,
        ),
        ("HTTP/1.0 200 OK\r\nX-Consul-Index: 3\r\nContent-Length: 2\r\n\r\n[]", Oddity::Close),
        (
            "HTTP/1.1 200 OK\r\nX-Consul-Index: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
            Oddity::NoLength,
        ),
        ("HTTP/1.1 200 OK\r\nX-Consul-Index: 3\r\n\r\n[]", Oddity::NoLength),
        ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]", Oddity::NoIndex),
        ("HTTP/1.1 200 OK\r\nX-Consul-Index: -1\r\nContent-Length: 2\r\n\r\n[]", Oddity::NoIndex),
    ];
    for (text, want) in cases {
        let mut answers = Answers::default();
        answers.feed(answer(1).as_bytes());
        answers.feed(text.as_bytes());
        answers.feed(answer(2).as_bytes());
        assert_eq!(parse_all(&mut answers), (vec![1], Some(want)), "{text:?}");
    }
    let mut answers = Answers::default();
    answers.feed(b"SSH-2.0-OpenSSH\r\n\r\n");
    assert_eq!(answers.next(), Err(Oddity::Malformed));
}

#[test]
fn reads_are_capped() {
    // A header section that never ends.
    let mut answers = Answers::default();
    answers.feed(b"HTTP/1.1 200 OK\r\n");
    let filler = "X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let mut fed = 0;
    let odd = loop {
        answers.feed(filler.as_bytes());
        fed += filler.len();
        match answers.next() {
            Ok(None) => assert!(fed <= MAX_HEAD_BYTES + filler.len(), "kept reading past the cap"),
            other => break other,
        }
    };
    assert_eq!(odd, Err(Oddity::HeadTooLarge));
    // Too many headers.
    let many: String = (0..40).map(|i| format!("X-H{i}: v\r\n")).collect();
    let mut answers = Answers::default();
    answers.feed(format!("HTTP/1.1 200 OK\r\n{many}Content-Length: 2\r\n\r\n[]").as_bytes());
    assert_eq!(answers.next(), Err(Oddity::HeadTooLarge));
    // A declared body over the cap is refused before it is read.
    let mut answers = Answers::default();
    let big = MAX_PROBE_BODY_BYTES + 1;
    answers.feed(format!("HTTP/1.1 200 OK\r\nX-Consul-Index: 3\r\nContent-Length: {big}\r\n\r\n").as_bytes());
    assert_eq!(answers.next(), Err(Oddity::BodyTooLarge));
}

/// A pipelining server on one end of an in-memory stream: reads requests
/// and answers each with `reply(n)` as it completes (so answers interleave
/// with requests still arriving).
async fn serve<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut io: S,
    reply: impl Fn(usize) -> String,
) -> Vec<String> {
    let mut got = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 97];
    loop {
        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = buf.drain(..end + 4).collect();
            got.push(String::from_utf8(head).unwrap());
            if io.write_all(reply(got.len()).as_bytes()).await.is_err() {
                return got;
            }
        }
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn requests(n: usize) -> Vec<u8> {
    (0..n).flat_map(|i| format!("GET /v1/health/service/s{i}?tag=x HTTP/1.1\r\nHost: h\r\n\r\n").into_bytes()).collect()
}

#[tokio::test]
async fn exchange_reads_every_answer_in_order() {
    let (client, server) = tokio::io::duplex(512);
    let served = tokio::spawn(serve(server, |n| answer(100 + n as u64)));
    let mut io = Raw::Stream(Box::new(client));
    let (indexes, _, odd) = exchange(&mut io, &requests(50), 50).await;
    assert_eq!(odd, None);
    assert_eq!(indexes, (101..=150).collect::<Vec<u64>>());
    drop(io);
    let heads = served.await.unwrap();
    assert_eq!(heads.len(), 50);
    assert!(heads[49].starts_with("GET /v1/health/service/s49?tag=x "), "{}", heads[49]);
}

#[tokio::test]
async fn exchange_stops_at_an_oddity_or_a_hang_up() {
    // The third answer is a 429: two indexes, then the oddity.
    let (client, server) = tokio::io::duplex(512);
    tokio::spawn(serve(server, |n| {
        if n == 3 { "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n".into() } else { answer(n as u64) }
    }));
    let mut io = Raw::Stream(Box::new(client));
    let (indexes, _, odd) = exchange(&mut io, &requests(6), 6).await;
    assert_eq!((indexes, odd), (vec![1, 2], Some(Oddity::Status(429))));

    // The server hangs up after one answer.
    let (client, mut server) = tokio::io::duplex(4096);
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let _ = server.read(&mut buf).await;
        let _ = server.write_all(answer(9).as_bytes()).await;
    });
    let mut io = Raw::Stream(Box::new(client));
    let (indexes, _, odd) = exchange(&mut io, &requests(4), 4).await;
    assert_eq!((indexes, odd), (vec![9], Some(Oddity::Closed)));

    // One answer too many: not reusable.
    let (client, mut server) = tokio::io::duplex(4096);
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        let _ = server.read(&mut buf).await;
        let _ = server.write_all(format!("{}{}", answer(1), answer(2)).as_bytes()).await;
        let _ = server.read(&mut buf).await;
    });
    let mut io = Raw::Stream(Box::new(client));
    let (indexes, _, odd) = exchange(&mut io, &requests(1), 1).await;
    assert_eq!((indexes, odd), (vec![1], Some(Oddity::Extra)));
}

/// A polled (non-reactor) socket to a [`serve`] on real TCP.
async fn polled_pair(reply: impl Fn(usize) -> String + Send + 'static) -> (Raw, tokio::task::JoinHandle<Vec<String>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        serve(conn, reply).await
    });
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    (Raw::Polled(tcp.into_std().unwrap()), served)
}

#[tokio::test]
async fn polled_exchange_reads_every_answer_in_order() {
    // More requests and answers than one read chunk or socket write holds.
    let (mut raw, served) = polled_pair(|n| answer(100 + n as u64)).await;
    let n = 600;
    let (indexes, answers, odd) = exchange(&mut raw, &requests(n), n).await;
    assert_eq!(odd, None);
    assert_eq!(indexes, (101..=100 + n as u64).collect::<Vec<u64>>());
    assert_eq!(answers.body_bytes, 2 * n as u64);
    // The connection is good for another batch.
    let (again, _, odd) = exchange(&mut raw, &requests(3), 3).await;
    assert_eq!((again, odd), (vec![701, 702, 703], None));
    drop(raw);
    let heads = served.await.unwrap();
    assert_eq!(heads.len(), n + 3);
    assert!(heads[n - 1].starts_with(&format!("GET /v1/health/service/s{}?tag=x ", n - 1)), "{}", heads[n - 1]);
}

#[tokio::test]
async fn polled_exchange_stops_at_an_oddity_or_a_hang_up() {
    let (mut raw, _) = polled_pair(|n| {
        if n == 3 { "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n".into() } else { answer(n as u64) }
    })
    .await;
    let (indexes, _, odd) = exchange(&mut raw, &requests(6), 6).await;
    assert_eq!((indexes, odd), (vec![1, 2], Some(Oddity::Status(429))));

    // The server answers one request and hangs up.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 64];
        let _ = conn.read(&mut buf).await;
        let _ = conn.write_all(answer(9).as_bytes()).await;
    });
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut raw = Raw::Polled(tcp.into_std().unwrap());
    let (indexes, _, odd) = exchange(&mut raw, &requests(4), 4).await;
    assert_eq!((indexes, odd), (vec![9], Some(Oddity::Closed)));
}

#[test]
fn ticks_are_shared_and_ahead() {
    let tick = Duration::from_millis(2);
    let now = Instant::now();
    let at = next_tick(now, tick);
    assert!(at > now && at <= now + tick, "{:?}", at - now);
    // Any instant before a tick is due at that same tick.
    assert_eq!(next_tick(at - Duration::from_micros(1500), tick), at);
    assert_eq!(next_tick(at - Duration::from_nanos(1), tick), at);
    // At a tick, the next one.
    assert_eq!(next_tick(at, tick), at + tick);
}
