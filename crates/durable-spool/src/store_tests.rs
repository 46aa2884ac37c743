use super::*;
use crate::legacy::SLED_FILES;

#[tokio::test]
async fn second_open_of_a_locked_store_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _first = Store::open(dir.path()).expect("first open");
    let err = Store::open(dir.path())
        .err()
        .expect("second open must fail");
    let text = err.to_string();
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
    assert!(text.contains("locked by another process"), "{text}");
}

#[tokio::test]
async fn legacy_pages_read_and_a_store_without_one_reads_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let t = store.tree("t").expect("tree");
    assert_eq!(t.first().expect("first"), None);
    assert!(!store.has_legacy(), "reads create no sled store");
    assert!(!dir.path().join("conf").exists());
    for i in 0u8..5 {
        t.insert(&[b'p', i], &[i]).expect("insert");
    }
    let p = t.page(Some(&[b'p', 1]), 2).expect("page");
    assert_eq!(p.iter().map(|(k, _)| k[1]).collect::<Vec<_>>(), vec![2, 3]);
    store.flush().await.expect("flush");
}

#[tokio::test]
async fn a_legacy_store_is_removed_only_once_every_tree_in_it_is_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(dir.path()).expect("open");
        store
            .tree("spool")
            .expect("tree")
            .insert(b"a", b"1")
            .expect("insert");
        store
            .tree("state")
            .expect("tree")
            .insert(b"b", b"2")
            .expect("insert");
        store.flush().await.expect("flush");
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert!(store.has_legacy());
    store
        .tree("spool")
        .expect("tree")
        .remove(b"a")
        .expect("remove");
    assert!(
        !store.retire_legacy_if_empty().expect("retire"),
        "state is left"
    );
    assert!(dir.path().join("conf").exists());
    store
        .tree("state")
        .expect("tree")
        .remove(b"b")
        .expect("remove");
    assert!(store.retire_legacy_if_empty().expect("retire"));
    assert!(!store.has_legacy());
    for name in SLED_FILES {
        assert!(!dir.path().join(name).exists(), "{name} left behind");
    }
    assert!(dir.path().join(SPOOL_FILE).exists());
    assert_eq!(store.tree("state").expect("tree").len(), 0);
}
