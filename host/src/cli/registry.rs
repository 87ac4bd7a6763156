//! `devplug push`, `pull`, `sign` and `precompile`: what an operator or a vendor's CI does with a registry,
//! through the same code `devplug run` pulls and verifies with.

use oci_client::Reference;

use super::{PrecompileArgs, PullArgs, PushArgs, SignArgs};
use crate::backends::BackendSource;
use crate::oci::{artifact, signature};

fn reference(text: &str) -> anyhow::Result<Reference> {
    text.parse().map_err(|e| anyhow::anyhow!("{text:?} is not an image reference: {e}"))
}

/// In the node build (without the `push` feature): where to push from.
#[cfg(not(feature = "push"))]
pub async fn push(_: PushArgs) -> anyhow::Result<serde_json::Value> {
    anyhow::bail!(
        "this devplug is the node build, without `push` (nodes only pull); push from the vendor build: \
         `cargo install --path host` (default features)"
    )
}

/// Push a backend; the digest it got (and the signature's reference when signed).
#[cfg(feature = "push")]
pub async fn push(args: PushArgs) -> anyhow::Result<serde_json::Value> {
    use crate::backends::manifest_for;
    use crate::oci::push;
    let settings = args.registry.settings()?;
    let client = settings.client()?;
    let r = reference(&args.reference)?;
    let auth = settings.auth_for(&r)?;
    // The same checks `run` makes before loading: a component this host serves, a manifest that
    // parses and names this backend.
    let manifest = manifest_for(&args.wasm, args.manifest.as_deref());
    let src = BackendSource::from_file_with(&args.wasm, manifest.as_deref())?;
    crate::cli::inspect::inspect(&args.wasm, manifest.as_deref())?;
    let text = match &manifest {
        Some(m) => Some(std::fs::read_to_string(m).map_err(|e| anyhow::anyhow!("{}: {e}", m.display()))?),
        None => None,
    };
    // The backend's name is its file's, as `run` names it (`gpu-1.3.0.wasm` is `gpu`).
    let name = src.name.clone();
    // A node follows `[backends.NAME] image`, and refuses an artifact that names another backend:
    // say so now rather than on the node.
    let repo_name = r.repository().rsplit('/').next().unwrap_or_default();
    let mismatch = (repo_name != name).then(|| {
        let warning = format!(
            "pushing backend {name:?} into repository {:?}: a node takes it only as [backends.{name}] image = \"...\"; a config entry [backends.{repo_name}] would refuse it (rename the file {repo_name}.wasm, or push to a repository named {name})",
            r.repository()
        );
        tracing::warn!("{warning}");
        warning
    });
    // A key that cannot sign is refused before anything is published: a tag must never appear
    // unsigned because the key turned out wrong afterwards.
    let key = args.sign_key.as_deref().map(signature::load_private_key).transpose()?;
    // By digest first; the signature next; the tag last: whatever fails on the way, no tag
    // names an unsigned artifact (a node following the tag never meets one).
    let staged = push::push_untagged(&client, &auth, &r, &name, src.bytes.into_owned(), text.as_deref()).await?;
    let digest = staged.digest.clone();
    let mut out = serde_json::json!({ "reference": args.reference, "digest": digest, "name": name });
    if let Some(w) = mismatch {
        out["warning"] = serde_json::json!(w);
    }
    if let Some(key) = &key {
        let sig = signature::sign(&client, &auth, &r, &digest, key)
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}; the artifact is stored by digest ({digest}) but no tag names it"))?;
        out["signature"] = serde_json::json!(sig.whole());
    } else {
        // Nodes that follow the tag with `[registry] public_key` refuse an unsigned artifact:
        // say so here, not only in their logs.
        let hint = format!(
            "pushed unsigned: a node whose [registry] public_key is set refuses it (signature required); sign it with `devplug sign {} --key KEY`, or push with --sign-key",
            args.reference
        );
        if settings.public_key.is_some() {
            tracing::warn!("{hint} (this config sets public_key)");
        } else {
            tracing::info!("{hint}");
        }
        out["hint"] = serde_json::json!(hint);
    }
    push::tag(&client, &r, &staged).await?;
    let fetcher = settings.fetcher()?;
    let tagged = artifact::resolve(&fetcher, &auth, &r).await?;
    anyhow::ensure!(tagged == digest, "{} resolves to {tagged}, not the {digest} just pushed", args.reference);
    Ok(out)
}

/// Resolve, verify and fetch a reference; fails when a given key does not verify it.
pub async fn pull(args: PullArgs) -> anyhow::Result<serde_json::Value> {
    let mut settings = args.registry.settings()?;
    if args.public_key.is_some() {
        settings.public_key = args.public_key.clone();
    }
    let fetcher = settings.fetcher()?;
    let r = reference(&args.reference)?;
    let auth = settings.auth_for(&r)?;
    let key = settings.public_key.as_deref().map(signature::load_public_key).transpose()?;
    let guess = args.name.clone().unwrap_or_else(|| r.repository().rsplit('/').next().unwrap_or("backend").to_owned());
    // The whole transfer is bounded, not only each read: a registry that drips a byte at a time
    // cannot hold `pull` for ever.
    let settings_timeout = settings.timeout;
    let within = |what: &'static str| {
        move |_| anyhow::anyhow!("{what} took longer than {:?} (registry.timeout)", settings_timeout)
    };
    let digest = tokio::time::timeout(settings_timeout, artifact::resolve(&fetcher, &auth, &r))
        .await
        .map_err(within("resolving"))??;
    let pinned = artifact::pinned(&r, &digest);
    let state =
        tokio::time::timeout(settings_timeout, signature::verify(&fetcher, &auth, &pinned, &digest, key.as_ref()))
            .await
            .map_err(within("the signature check"))??;
    let pulled = tokio::time::timeout(settings_timeout, artifact::pull(&fetcher, &auth, &pinned, &guess))
        .await
        .map_err(within("the pull"))??;
    // A Wasm artifact says its backend's name; `--name` wins, as the config key does in `run`.
    let name = args.name.clone().or_else(|| pulled.name.clone()).unwrap_or(guess);
    let src = BackendSource::from_registry(&name, &args.reference, pulled.clone())?;
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(format!("{name}.wasm")), &pulled.component)?;
        if !pulled.manifest.is_empty() {
            std::fs::write(dir.join(format!("{name}.toml")), &pulled.manifest)?;
        }
    }
    let out = serde_json::json!({
        "reference": args.reference,
        "digest": digest,
        "name": name,
        "layout": pulled.layout,
        "size": pulled.component.len(),
        "signature": state,
        "requests": src.manifest.requests,
    });
    anyhow::ensure!(
        state.accepted(),
        "{}: {state}; devplug run with this public key refuses it\n{}",
        args.reference,
        serde_json::to_string_pretty(&out)?
    );
    Ok(out)
}

/// Sign what a reference resolves to; the signature's reference.
pub async fn sign(args: SignArgs) -> anyhow::Result<serde_json::Value> {
    let settings = args.registry.settings()?;
    let client = settings.client()?;
    let r = reference(&args.reference)?;
    let auth = settings.auth_for(&r)?;
    let key = signature::load_private_key(&args.key)?;
    let digest = artifact::resolve(&settings.fetcher()?, &auth, &r).await?;
    let sig = signature::sign(&client, &auth, &r, &digest, &key).await?;
    Ok(serde_json::json!({ "reference": args.reference, "digest": digest, "signature": sig.whole() }))
}

/// In the node build (without the `push` feature): where to precompile from.
#[cfg(not(feature = "push"))]
pub async fn precompile(_: PrecompileArgs) -> anyhow::Result<serde_json::Value> {
    anyhow::bail!(
        "this devplug is the node build, without `precompile` (nodes never sign code); run it from the vendor build of the same version: \
         `cargo install --path host` (default features)"
    )
}

/// Compile what a reference resolves to for this build's engine (portable CPU baseline) and
/// attach the code to it, signed with the operator's key; then, with `--promote`, move the tag
/// the cluster follows. What was attached.
#[cfg(feature = "push")]
pub async fn precompile(args: PrecompileArgs) -> anyhow::Result<serde_json::Value> {
    use crate::oci::native;
    use crate::runtime::compile_worker::CompileBudget;
    let settings = args.registry.settings()?;
    let client = settings.client()?;
    let fetcher = settings.fetcher()?;
    let r = reference(&args.reference)?;
    let auth = settings.auth_for(&r)?;
    // Both keys are read before anything is compiled or written: a wrong key fails in a moment,
    // not after a minute's compile.
    let key = signature::load_private_key(&args.key)?;
    let vendor = args.public_key.as_deref().map(signature::load_public_key).transpose()?;
    anyhow::ensure!(
        vendor != Some(*key.verifying_key()),
        "--key is the backends' signing key (--public-key verifies with it): native code must be signed by the operator's own key, which nodes hold as registry.operator_key"
    );
    let promote = match &args.promote {
        Some(tag) => {
            let to = Reference::with_tag(r.registry().to_owned(), r.repository().to_owned(), tag.clone());
            anyhow::ensure!(to.whole().parse::<Reference>().is_ok(), "--promote {tag:?} is not a tag");
            Some(to)
        }
        None => None,
    };
    let within = |what: &'static str| {
        let t = settings.timeout;
        move |_| anyhow::anyhow!("{what} took longer than {t:?} (registry.timeout)")
    };
    let (raw, digest) = tokio::time::timeout(
        settings.timeout,
        fetcher.manifest(
            &r,
            &auth,
            &[oci_client::manifest::OCI_IMAGE_MEDIA_TYPE, oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE],
        ),
    )
    .await
    .map_err(within("reading the manifest"))??;
    let pinned = artifact::pinned(&r, &digest);
    if let Some(vendor) = &vendor {
        let state =
            tokio::time::timeout(settings.timeout, signature::verify(&fetcher, &auth, &pinned, &digest, Some(vendor)))
                .await
                .map_err(within("the signature check"))??;
        anyhow::ensure!(state.accepted(), "{}: {state}; not compiled (--public-key)", args.reference);
    }
    let guess = args.name.clone().unwrap_or_else(|| r.repository().rsplit('/').next().unwrap_or("backend").to_owned());
    let pulled = tokio::time::timeout(settings.timeout, artifact::pull(&fetcher, &auth, &pinned, &guess))
        .await
        .map_err(within("the pull"))??;
    let component = format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&pulled.component)));
    let fingerprint = crate::runtime::native::fingerprint()?;
    let budget = CompileBudget {
        memory_bytes: args.compile_memory_mb.saturating_mul(1 << 20),
        cpu_base_secs: args.compile_cpu_secs,
        cpu_secs_per_mib: args.compile_cpu_secs_per_mib,
    };
    let started = std::time::Instant::now();
    let bytes = pulled.component;
    let code = tokio::task::spawn_blocking(move || {
        crate::runtime::native::precompile(crate::runtime::compile_worker::registered().as_deref(), &bytes, &budget)
    })
    .await?
    .map_err(|e| anyhow::anyhow!("{}: not compiled: {e}", args.reference))?;
    let compile_secs = started.elapsed().as_secs_f64();
    let size = code.len();
    let media_type = serde_json::from_slice::<serde_json::Value>(&raw)
        .ok()
        .and_then(|m| m["mediaType"].as_str().map(str::to_owned))
        .filter(|t| t == oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE)
        .unwrap_or_else(|| oci_client::manifest::OCI_IMAGE_MEDIA_TYPE.to_owned());
    let subject = oci_client::manifest::OciDescriptor {
        media_type: media_type.clone(),
        digest: digest.clone(),
        size: raw.len() as i64,
        ..Default::default()
    };
    let attachment = native::Attachment {
        subject,
        component: component.clone(),
        fingerprint: fingerprint.clone(),
        target: crate::runtime::native::target().to_owned(),
        code,
    };
    let (native_digest, tagged) = native::attach(&client, &auth, &r, attachment, &key).await?;
    let mut out = serde_json::json!({
        "reference": args.reference,
        "digest": digest,
        "component": component,
        "engine": fingerprint,
        "target": crate::runtime::native::target(),
        "native": { "digest": native_digest, "tag": tagged.whole(), "bytes": size },
        "compile_secs": (compile_secs * 100.0).round() / 100.0,
    });
    if let Some(to) = promote {
        client
            .push_manifest_raw(&to, raw, media_type.parse()?)
            .await
            .map_err(|e| anyhow::anyhow!("promoting to {to}: {e}; the native code is attached ({native_digest})"))?;
        let now = artifact::resolve(&fetcher, &auth, &to).await?;
        anyhow::ensure!(now == digest, "{to} resolves to {now}, not {digest}");
        out["promoted"] = serde_json::json!(to.whole());
    }
    Ok(out)
}
