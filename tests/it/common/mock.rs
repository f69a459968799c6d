//! librdkafka's in-process mock cluster, driven through its C API, for what
//! Tansu cannot show: a broker that refuses Produce, answers slowly, or says
//! a topic is gone. It listens on loopback ports hourglass reaches like any
//! broker's.

use std::ffi::{CStr, CString};

#[allow(unused_imports)]
pub use rdkafka::types::RDKafkaRespErr;
use rdkafka::{
    ClientConfig, bindings as rd,
    producer::{BaseProducer, Producer as _},
    types::RDKafkaRespErr as RespErr,
};

pub struct Mock {
    /// Owns the mock cluster; it lives as long as this client.
    pub owner: BaseProducer,
    cluster: *mut rd::rd_kafka_mock_cluster_t,
}

// The mock cluster runs on its own thread; its C API is thread-safe.
unsafe impl Send for Mock {}
unsafe impl Sync for Mock {}

const PRODUCE: i16 = rdkafka::types::RDKafkaApiKey::Produce as i16;

impl Mock {
    pub fn start(brokers: usize) -> Mock {
        let owner: BaseProducer =
            ClientConfig::new().set("test.mock.num.brokers", brokers.to_string()).create().unwrap();
        let cluster = unsafe { rd::rd_kafka_handle_mock_cluster(owner.client().native_ptr()) };
        assert!(!cluster.is_null(), "librdkafka built without the mock cluster");
        Mock { owner, cluster }
    }

    pub fn bootstrap(&self) -> String {
        unsafe { CStr::from_ptr(rd::rd_kafka_mock_cluster_bootstraps(self.cluster)) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// A one-partition topic led by `leader`.
    pub fn topic(&self, name: &str, leader: i32) {
        let c = CString::new(name).unwrap();
        unsafe {
            assert_eq!(
                rd::rd_kafka_mock_topic_create(self.cluster, c.as_ptr(), 1, 1),
                RespErr::RD_KAFKA_RESP_ERR_NO_ERROR
            );
            assert_eq!(
                rd::rd_kafka_mock_partition_set_leader(self.cluster, c.as_ptr(), 0, leader),
                RespErr::RD_KAFKA_RESP_ERR_NO_ERROR
            );
        }
    }

    /// A topic of `partitions` partitions, every one led by `leader`.
    #[allow(dead_code)]
    pub fn topic_led(&self, name: &str, partitions: i32, leader: i32) {
        let c = CString::new(name).unwrap();
        unsafe {
            let created = rd::rd_kafka_mock_topic_create(self.cluster, c.as_ptr(), partitions, 1);
            assert_eq!(created, RespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
            for partition in 0..partitions {
                let led = rd::rd_kafka_mock_partition_set_leader(self.cluster, c.as_ptr(), partition, leader);
                assert_eq!(led, RespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
            }
        }
    }

    /// A topic of `partitions` partitions, led by the cluster's brokers.
    #[allow(dead_code)]
    pub fn topic_with(&self, name: &str, partitions: i32) {
        let c = CString::new(name).unwrap();
        let created = unsafe { rd::rd_kafka_mock_topic_create(self.cluster, c.as_ptr(), partitions, 1) };
        assert_eq!(created, RespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
    }

    /// From now on the cluster answers metadata requests for `topic` with
    /// `error` (NO_ERROR to stop).
    pub fn topic_error(&self, topic: &str, error: RespErr) {
        let c = CString::new(topic).unwrap();
        unsafe { rd::rd_kafka_mock_topic_set_error(self.cluster, c.as_ptr(), error) };
    }

    /// The next `count` Produce requests to `broker` fail with `error`.
    pub fn fail_produce(&self, broker: i32, error: RespErr, count: usize) {
        for _ in 0..count {
            let pushed = unsafe {
                rd::rd_kafka_mock_broker_push_request_error_rtts(
                    self.cluster,
                    broker,
                    PRODUCE,
                    1,
                    error as i32,
                    0i32,
                )
            };
            assert_eq!(pushed, RespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
        }
    }

    /// How many of the Produce errors [`Mock::fail_produce`] pushed for
    /// `broker` no request took yet.
    #[allow(dead_code)]
    pub fn produce_errors_left(&self, broker: i32) -> usize {
        let mut left = 0usize;
        let asked =
            unsafe { rd::rd_kafka_mock_broker_error_stack_cnt(self.cluster, broker, PRODUCE, &mut left) };
        assert_eq!(asked, RespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
        left
    }

    /// The next `count` Produce requests to any broker fail with `error`,
    /// until [`Mock::clear_produce_errors`].
    pub fn fail_every_produce(&self, error: RespErr, count: usize) {
        let errors = vec![error; count];
        unsafe { rd::rd_kafka_mock_push_request_errors_array(self.cluster, PRODUCE, count, errors.as_ptr()) };
    }

    /// Drops the Produce errors [`Mock::fail_every_produce`] pushed and
    /// that no request took yet.
    pub fn clear_produce_errors(&self) {
        unsafe { rd::rd_kafka_mock_clear_request_errors(self.cluster, PRODUCE) };
    }

    /// The next requests of kind `api` to any broker fail with `errors`,
    /// one each, in order.
    #[allow(dead_code)]
    pub fn fail_next(&self, api: rdkafka::types::RDKafkaApiKey, errors: &[RespErr]) {
        unsafe {
            rd::rd_kafka_mock_push_request_errors_array(
                self.cluster,
                api as i16,
                errors.len(),
                errors.as_ptr(),
            )
        };
    }

    /// Every request to `broker` is answered `rtt_ms` late (0 to stop);
    /// a Produce is written at once, only its answer waits.
    pub fn slow_broker(&self, broker: i32, rtt_ms: i32) {
        let set = unsafe { rd::rd_kafka_mock_broker_set_rtt(self.cluster, broker, rtt_ms) };
        assert_eq!(set, RespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
    }
}
