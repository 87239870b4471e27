//! InitProducerId: idempotent producers here, transactional ones (with a
//! transactional id) through the transaction coordinator.

use std::future::Future;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::authorize::{refusal_or, CLUSTER_DENIED, TXN_ID_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::error::catalog_error_code;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;
use crate::catalog::Catalog;
use crate::cluster::ClusterNode;
use crate::coordinator::txn::ProducerIdSource;

pub(super) const INIT_PRODUCER_ID: Api =
    api!(InitProducerIdRequest, 0..=5, later(handle_init_producer_id));

error_codes! {
    InitProducerIdResponse => |r, f| f(r.error_code);
}

fn handle_init_producer_id(
    b: &Arc<Broker>,
    r: InitProducerIdRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = InitProducerIdResponse> + Send + 'static {
    let refusal = init_producer_id_error(b, cx, &r).map(|code| {
        InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id((-1).into())
            .with_producer_epoch(-1)
    });
    refusal_or(refusal, || init_producer_id(b.clone(), r, cx.version))
}

/// InitProducerId: WRITE on the transactional id, or for an idempotent
/// producer IDEMPOTENT_WRITE on the cluster or WRITE on any topic (KIP-679).
fn init_producer_id_error(b: &Broker, cx: &Ctx<'_>, req: &InitProducerIdRequest) -> Option<i16> {
    match &req.transactional_id {
        Some(id) if !b.may_write_transactional_id(cx, id) => Some(TXN_ID_DENIED),
        Some(_) => None,
        None => {
            let may = b.on_cluster(cx, Operation::IdempotentWrite)
                || !b.access.authorizer_enabled()
                || b.catalog
                    .topics()
                    .iter()
                    .any(|t| b.on_topic(cx, Operation::Write, t.name()));
            (!may).then_some(CLUSTER_DENIED)
        }
    }
}

pub(super) async fn init_producer_id(
    broker: Arc<Broker>,
    req: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default();
    if req.transactional_id.is_some() {
        return super::transactions::init_producer_id(broker, req, version).await;
    }
    // KIP-360: an idempotent producer may ask to bump its own epoch.
    if req.producer_id.0 >= 0 && req.producer_epoch >= 0 && req.producer_epoch < i16::MAX - 1 {
        return resp
            .with_producer_id(req.producer_id)
            .with_producer_epoch(req.producer_epoch + 1);
    }
    match allocate(&broker.catalog, broker.cluster.as_deref()).await {
        Ok(id) => resp.with_producer_id(ProducerId(id)).with_producer_epoch(0),
        Err(code) => resp
            .with_error_code(code)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    }
}

/// A new producer id. In cluster mode ids come from blocks agreed in etcd,
/// so no two brokers hand out the same one.
async fn allocate(catalog: &Catalog, cluster: Option<&ClusterNode>) -> Result<i64, i16> {
    match cluster {
        None => catalog
            .allocate_producer_id()
            .map_err(|e| catalog_error_code(&e)),
        Some(c) => c.next_producer_id().await.map_err(|e| {
            tracing::warn!(error = %e, "no producer id block from etcd");
            ResponseError::CoordinatorNotAvailable.code()
        }),
    }
}

/// The transaction coordinator's producer ids, drawn like an idempotent producer's.
pub(super) fn source(catalog: Arc<Catalog>, cluster: Option<Arc<ClusterNode>>) -> ProducerIdSource {
    Arc::new(move || {
        let (catalog, cluster) = (catalog.clone(), cluster.clone());
        Box::pin(async move {
            allocate(&catalog, cluster.as_deref())
                .await
                .map_err(|code| format!("error code {code}"))
        })
    })
}
