//! Watches (through kube-runtime's own watcher) and the HTTP front end
//! (through a kube client built from the written kubeconfig).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use ic_fake_apiserver::{FakeApi, TokenIdentity, write_kubeconfig};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "a", "labels": {"app": "x"}},
        "data": {"v": value},
    }))
    .unwrap()
}

async fn next_change(
    stream: &mut (impl futures::Stream<Item = Result<Event<ConfigMap>, watcher::Error>> + Unpin),
) -> Event<ConfigMap> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("a watch event within 10 s")
            .expect("the stream goes on")
            .expect("no watch error");
        match event {
            Event::Init | Event::InitDone => continue,
            other => return other,
        }
    }
}

#[tokio::test]
async fn a_kube_runtime_watcher_sees_every_change() {
    let fake = FakeApi::new();
    let api: Api<ConfigMap> = Api::namespaced(fake.client(), "a");
    api.create(&PostParams::default(), &config_map("first", "1"))
        .await
        .unwrap();
    let mut stream =
        watcher::watcher(api.clone(), watcher::Config::default().labels("app=x")).boxed();
    // The initial list.
    match next_change(&mut stream).await {
        Event::InitApply(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("first")),
        other => panic!("{other:?}"),
    }
    api.create(&PostParams::default(), &config_map("second", "2"))
        .await
        .unwrap();
    match next_change(&mut stream).await {
        Event::Apply(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("second")),
        other => panic!("{other:?}"),
    }
    let mut changed = api.get("first").await.unwrap();
    changed.data = Some([("v".to_owned(), "3".to_owned())].into());
    api.replace("first", &PostParams::default(), &changed)
        .await
        .unwrap();
    match next_change(&mut stream).await {
        Event::Apply(cm) => assert_eq!(cm.data.unwrap()["v"], "3"),
        other => panic!("{other:?}"),
    }
    api.delete("second", &DeleteParams::default())
        .await
        .unwrap();
    match next_change(&mut stream).await {
        Event::Delete(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("second")),
        other => panic!("{other:?}"),
    }
    // Objects the selector does not match are not sent.
    let mut other = config_map("unlabelled", "4");
    other.metadata.labels = None;
    api.create(&PostParams::default(), &other).await.unwrap();
    fake.insert(&config_map("seeded", "5"));
    match next_change(&mut stream).await {
        Event::Apply(cm) => assert_eq!(cm.metadata.name.as_deref(), Some("seeded")),
        other => panic!("{other:?}"),
    }
    let watches = fake
        .requests()
        .iter()
        .filter(|r| r.query.get("watch").map(String::as_str) == Some("true"))
        .count();
    assert!(watches >= 1, "the watcher watched");
}

#[tokio::test]
async fn served_over_http_with_a_kubeconfig_and_token_reviews() {
    let fake = FakeApi::new();
    fake.add_token(
        "good",
        TokenIdentity {
            username: "system:serviceaccount:ic:controller".into(),
            audiences: vec!["index".into()],
            ..Default::default()
        },
    );
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = write_kubeconfig(dir.path(), served.addr, "sa-token", "a").unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    api.create(&PostParams::default(), &config_map("over-http", "1"))
        .await
        .unwrap();
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);
    assert!(api.get_opt("missing").await.unwrap().is_none());

    let reviews: Api<TokenReview> = Api::all(client);
    let review = |token: &str, audience: &str| TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.into()),
            audiences: Some(vec![audience.into()]),
        },
        ..TokenReview::default()
    };
    let ok = reviews
        .create(&PostParams::default(), &review("good", "index"))
        .await
        .unwrap();
    let status = ok.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(
        status.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:ic:controller")
    );
    let wrong_audience = reviews
        .create(&PostParams::default(), &review("good", "other"))
        .await
        .unwrap();
    assert_eq!(wrong_audience.status.unwrap().authenticated, Some(false));
    let unknown = reviews
        .create(&PostParams::default(), &review("bad", "index"))
        .await
        .unwrap();
    assert_eq!(unknown.status.unwrap().authenticated, Some(false));
}
