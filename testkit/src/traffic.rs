//! Someone else's traffic on a topic: records without hourglass's headers,
//! written at a steady rate, for what hourglass must not be slowed or
//! confused by.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use rdkafka::{
    ClientConfig,
    producer::{BaseProducer, BaseRecord, Producer as _},
};

/// Writes about `per_second` records of 100 bytes to `topic` until
/// `running` is cleared; the thread returns how many it wrote.
pub fn other_producer(
    brokers: &str,
    topic: &str,
    per_second: u64,
    running: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<u64>> {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", brokers).set("linger.ms", "5").create()?;
    let topic = topic.to_owned();
    Ok(std::thread::spawn(move || {
        let (started, mut written) = (Instant::now(), 0u64);
        let payload = [b'x'; 100];
        while running.load(Ordering::Relaxed) {
            let due = (started.elapsed().as_secs_f64() * per_second as f64) as u64;
            while written < due {
                let key = written.to_string();
                if producer.send(BaseRecord::to(&topic).key(&key).payload(&payload[..])).is_err() {
                    break;
                }
                written += 1;
            }
            producer.poll(Duration::from_millis(5));
        }
        let _ = producer.flush(Duration::from_secs(30));
        written
    }))
}
