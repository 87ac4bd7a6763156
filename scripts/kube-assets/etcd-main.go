// devplug-etcd: etcd for the envtest convention, built from the etcd server that a Kubernetes
// tree vendors (go.etcd.io/etcd/server/v3/embed). It takes the standard etcd flags envtest
// passes (--data-dir, --listen-client-urls, --advertise-client-urls, --listen-peer-urls,
// --initial-advertise-peer-urls, --initial-cluster, --name, --unsafe-no-fsync) and serves until
// SIGTERM/SIGINT. scripts/kube-assets/build copies this file into the tree as cmd/devplug-etcd.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func urls(name, value string) []url.URL {
	var out []url.URL
	for _, s := range strings.Split(value, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintf(os.Stderr, "--%s: %v\n", name, err)
			os.Exit(2)
		}
		out = append(out, *u)
	}
	return out
}

func main() {
	cfg := embed.NewConfig()
	dataDir := flag.String("data-dir", "default.etcd", "directory of the data")
	name := flag.String("name", "default", "member name")
	listenClient := flag.String("listen-client-urls", "http://127.0.0.1:2379", "client URLs to listen on")
	advertiseClient := flag.String("advertise-client-urls", "", "client URLs to advertise (default: the listen URLs)")
	listenPeer := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URLs to listen on")
	advertisePeer := flag.String("initial-advertise-peer-urls", "", "peer URLs to advertise (default: the listen URLs)")
	initialCluster := flag.String("initial-cluster", "", "initial cluster (default: NAME=advertised peer URL)")
	noFsync := flag.Bool("unsafe-no-fsync", false, "skip fsync (tests only)")
	flag.Parse()

	cfg.Dir = *dataDir
	cfg.Name = *name
	cfg.ListenClientUrls = urls("listen-client-urls", *listenClient)
	if *advertiseClient == "" {
		*advertiseClient = *listenClient
	}
	cfg.AdvertiseClientUrls = urls("advertise-client-urls", *advertiseClient)
	cfg.ListenPeerUrls = urls("listen-peer-urls", *listenPeer)
	if *advertisePeer == "" {
		*advertisePeer = *listenPeer
	}
	cfg.AdvertisePeerUrls = urls("initial-advertise-peer-urls", *advertisePeer)
	if *initialCluster == "" {
		*initialCluster = cfg.InitialClusterFromName(*name)
	}
	cfg.InitialCluster = *initialCluster
	cfg.UnsafeNoFsync = *noFsync
	cfg.LogLevel = "warn"

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		os.Exit(1)
	}
	defer e.Close()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: ready")
	case <-stop:
		return
	}
	select {
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		os.Exit(1)
	case <-stop:
	}
}
