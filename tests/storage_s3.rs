//! The storage layer against a real S3-compatible server: s3s-fs, started by each test on a
//! free loopback port with a temporary directory, and killed when the test ends.
//!
//! s3s-fs must be installed (it is not skipped when missing):
//! `cargo install s3s-fs@0.14.1 --features binary --locked`.

use std::time::Duration;

use bytes::Bytes;
use iota::storage::{
    Direction, Hotkey, ObjectInfo, ObjectKey, PresignMethod, RunKeys, StatePart, Storage,
    StorageError, download_from_url, payload_hash, upload_to_url,
};

mod common;

use common::{BUCKET, S3Server};

fn key(s: &str) -> ObjectKey {
    ObjectKey::parse(s).expect("valid key")
}

/// 0, 1, ..., 250, 0, ...: a payload whose every byte is predictable.
fn pattern(len: usize) -> Bytes {
    (0..len).map(|i| (i % 251) as u8).collect()
}

#[tokio::test]
async fn put_get_range_list_delete() {
    let server = S3Server::start();
    let storage = server.storage();
    let keys = RunKeys::new("run1").unwrap();
    let alice = Hotkey::new("5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY").unwrap();
    let act = keys.activation(0, 42, 1, Direction::Forward);
    let w = keys.weights(1, 3, &alice, StatePart::Parameters);
    let opt = keys.weights(1, 3, &alice, StatePart::Optimizer);

    let hash = storage.put(&act, pattern(1000)).await.unwrap();
    assert_eq!(hash, payload_hash(&pattern(1000)));
    storage.put(&w, pattern(10)).await.unwrap();
    storage.put(&opt, pattern(20)).await.unwrap();

    assert_eq!(storage.get(&act).await.unwrap(), pattern(1000));
    assert_eq!(
        storage.get_verified(&act, &hash).await.unwrap(),
        pattern(1000)
    );
    assert!(matches!(
        storage.get_verified(&act, &payload_hash(b"other")).await,
        Err(StorageError::HashMismatch { .. })
    ));
    assert_eq!(storage.head(&act).await.unwrap(), 1000);
    // Bytes 500..505 are 500 % 251 = 249, 250, 0, 1, 2.
    assert_eq!(
        storage.get_range(&act, 500..505).await.unwrap().as_ref(),
        &[249, 250, 0, 1, 2]
    );
    assert!(storage.get_range(&act, 990..1010).await.is_err());

    assert_eq!(
        storage.list(Some(&keys.weights_epoch(1, 3))).await.unwrap(),
        vec![
            ObjectInfo {
                key: opt.clone(),
                size: 20
            },
            ObjectInfo {
                key: w.clone(),
                size: 10
            },
        ]
    );
    assert_eq!(storage.list(None).await.unwrap().len(), 3);

    // Everything sits under the configured prefix in the bucket directory.
    let on_disk = server
        .dir
        .path()
        .join("data")
        .join(BUCKET)
        .join("deploy")
        .join(act.as_str());
    assert_eq!(std::fs::read(on_disk).unwrap(), pattern(1000).to_vec());

    storage.delete(&act).await.unwrap();
    storage.delete(&act).await.unwrap();
    assert!(!storage.exists(&act).await.unwrap());
    assert!(matches!(
        storage.get(&act).await,
        Err(StorageError::NotFound { .. })
    ));
    assert_eq!(
        storage
            .delete_prefix(&keys.weights_epoch(1, 3))
            .await
            .unwrap(),
        2
    );
    assert!(storage.list(None).await.unwrap().is_empty());
}

#[tokio::test]
async fn multipart_upload_of_a_large_payload() {
    let server = S3Server::start();
    let part = 5 * 1024 * 1024;
    let storage = server.storage().with_multipart(part, part).unwrap();
    let k = key("runs/run1/checkpoints/1/0/parameters");
    // Two full 5 MiB parts and a 3-byte tail.
    let payload = pattern(2 * part + 3);
    let hash = storage.put(&k, payload.clone()).await.unwrap();
    assert_eq!(hash, payload_hash(&payload));
    assert_eq!(storage.head(&k).await.unwrap(), (2 * part + 3) as u64);
    assert_eq!(storage.get_verified(&k, &hash).await.unwrap(), payload);
    // A range across the first part boundary.
    let start = part as u64 - 2;
    let expected: Vec<u8> = (start..start + 4).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        storage
            .get_range(&k, start..start + 4)
            .await
            .unwrap()
            .as_ref(),
        expected.as_slice()
    );
}

#[tokio::test]
async fn presigned_put_then_presigned_get() {
    let server = S3Server::start();
    let storage = server.storage();
    let k = key("runs/run1/merged/0/2/5/miner/parameters");
    let ttl = Duration::from_secs(120);
    let put_url = storage
        .presign(PresignMethod::Put, &k, ttl)
        .await
        .unwrap()
        .expect("S3 presigns");
    let get_url = storage
        .presign(PresignMethod::Get, &k, ttl)
        .await
        .unwrap()
        .expect("S3 presigns");

    // A client without credentials uploads and downloads through the URLs alone.
    let payload = pattern(4096);
    upload_to_url(&put_url, payload.clone()).await.unwrap();
    assert_eq!(download_from_url(&get_url, None).await.unwrap(), payload);
    assert_eq!(
        download_from_url(&get_url, Some(251..254))
            .await
            .unwrap()
            .as_ref(),
        &[0, 1, 2]
    );
    assert_eq!(
        storage
            .get_verified(&k, &payload_hash(&payload))
            .await
            .unwrap(),
        payload
    );

    // A GET URL does not allow a PUT, and a tampered signature is refused at once (no retry
    // on 403).
    let wrong_method = upload_to_url(&get_url, Bytes::from_static(b"x")).await;
    assert!(
        matches!(
            wrong_method,
            Err(StorageError::HttpStatus {
                status: 403,
                attempts: 1,
                ..
            })
        ),
        "{wrong_method:?}"
    );
    let signature = get_url
        .query_pairs()
        .find(|(name, _)| name == "X-Amz-Signature")
        .map(|(_, value)| value.into_owned())
        .expect("presigned URL carries a signature");
    let forged = "0".repeat(signature.len());
    let tampered = url::Url::parse(&get_url.as_str().replace(&signature, &forged)).unwrap();
    let refused = download_from_url(&tampered, None).await;
    assert!(
        matches!(refused, Err(StorageError::HttpStatus { status: 403, .. })),
        "{refused:?}"
    );
    // The object is unchanged.
    assert_eq!(storage.get(&k).await.unwrap(), payload);
}

#[tokio::test]
async fn a_wrong_secret_is_refused() {
    let server = S3Server::start();
    let good = server.storage();
    let k = key("runs/run1/x");
    good.put(&k, Bytes::from_static(b"secret data"))
        .await
        .unwrap();

    let bad = Storage::open(&server.config("not-the-secret")).unwrap();
    let put = bad.put(&k, Bytes::from_static(b"overwrite")).await;
    assert!(
        matches!(put, Err(StorageError::AccessDenied { .. })),
        "{put:?}"
    );
    let get = bad.get(&k).await;
    assert!(
        matches!(get, Err(StorageError::AccessDenied { .. })),
        "{get:?}"
    );
    // A URL signed with the wrong secret is refused too.
    let url = bad
        .presign(PresignMethod::Get, &k, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("S3 presigns");
    assert!(matches!(
        download_from_url(&url, None).await,
        Err(StorageError::HttpStatus { status: 403, .. })
    ));
    assert_eq!(good.get(&k).await.unwrap().as_ref(), b"secret data");
}
