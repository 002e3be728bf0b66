// Command faultproxy is Toxiproxy's server with the toxics of test/faultproxy: the data-plane
// tests run it inside a network namespace between the lockstepd instances.
package main

import (
	"flag"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/Shopify/toxiproxy/v2"

	"github.com/lockstep-dev/lockstep/test/faultproxy"
)

func main() {
	host := flag.String("host", "127.0.0.1", "Address of the HTTP API.")
	port := flag.String("port", "8474", "Port of the HTTP API.")
	flag.Parse()
	faultproxy.Register()
	logger := zerolog.New(os.Stderr).Level(zerolog.WarnLevel)
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), logger)
	server.Listen(*host, *port)
}
