//! InitProducerId for idempotent producers (transactions are not supported).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::error::catalog_error_code;
use super::Broker;

pub async fn init_producer_id(
    broker: Arc<Broker>,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default();
    if req.transactional_id.is_some() {
        tracing::warn!("transactional producer refused: transactions are not supported");
        return resp.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    // KIP-360: an idempotent producer may ask to bump its own epoch.
    if req.producer_id.0 >= 0 && req.producer_epoch >= 0 && req.producer_epoch < i16::MAX - 1 {
        return resp
            .with_producer_id(req.producer_id)
            .with_producer_epoch(req.producer_epoch + 1);
    }
    // In cluster mode ids come from blocks agreed in etcd, so no two
    // brokers hand out the same one.
    let allocated = match &broker.cluster {
        None => broker
            .catalog
            .allocate_producer_id()
            .map_err(|e| catalog_error_code(&e)),
        Some(c) => c.next_producer_id().await.map_err(|e| {
            tracing::warn!(error = %e, "no producer id block from etcd");
            ResponseError::CoordinatorNotAvailable.code()
        }),
    };
    match allocated {
        Ok(id) => resp.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(code) => resp
            .with_error_code(code)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    }
}
