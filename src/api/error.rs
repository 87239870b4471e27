//! Catalog and log errors as Kafka error codes: the one place they meet.

use kafka_protocol::error::ResponseError;

use crate::catalog::CatalogError;
use crate::log::LogError;

pub(super) fn log_error_code(e: &LogError) -> i16 {
    match e {
        LogError::Io(_) => ResponseError::KafkaStorageError,
        LogError::Corrupt(_) => ResponseError::CorruptMessage,
        LogError::InvalidRecord(_) => ResponseError::InvalidRecord,
        LogError::UnsupportedMagic(_) => ResponseError::UnsupportedForMessageFormat,
        LogError::MessageTooLarge { .. } => ResponseError::MessageTooLarge,
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        LogError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        LogError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
        LogError::CoordinatorFenced { .. } => ResponseError::TransactionCoordinatorFenced,
        LogError::InvalidTxnState { .. } => ResponseError::InvalidTxnState,
        // Both retriable for every client: the store is slow or down.
        LogError::Remote(_) | LogError::Backpressure => ResponseError::KafkaStorageError,
        // Retriable: the client refreshes metadata and finds the new leader.
        LogError::Fenced => ResponseError::NotLeaderOrFollower,
    }
    .code()
}

pub(super) fn catalog_error_code(e: &CatalogError) -> i16 {
    match e {
        CatalogError::TopicExists(_) => ResponseError::TopicAlreadyExists.code(),
        CatalogError::InvalidTopic(_) => ResponseError::InvalidTopicException.code(),
        CatalogError::UnknownTopic => ResponseError::UnknownTopicOrPartition.code(),
        CatalogError::InvalidPartitions(_) => ResponseError::InvalidPartitions.code(),
        CatalogError::InvalidReplicationFactor(_) => ResponseError::InvalidReplicationFactor.code(),
        CatalogError::InvalidConfig(_) => ResponseError::InvalidConfig.code(),
        CatalogError::Log(l) => log_error_code(l),
    }
}
