package workloads

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// streamPort is the port the written-once stream is served on in the guest.
const streamPort = 5202

// streamTransmit is a second network transmit row, beside iperf3 -R: a stream from the VM whose
// every byte is written once, in order, by blocking writes, as a file server or the white paper's
// netperf sends. iperf3 writes on a non-blocking socket and begins its buffer again after a write
// the socket took only part of, so where its stream is cut depends on timing: the two members of
// a COLO pair send different bytes at the same place of the stream, and colo-compare forces a
// checkpoint for nearly every comparison (docs/performance.md, the transmit row's trace). This
// row's bytes are zeros written by dd on a socket systemd-socket-activate accepted: what the VM
// sends depends on nothing but the stream's position, as a file's content does.
var streamTransmit = Workload{
	Name: "net-transmit-stream", Title: "Network transmit, each byte written once (dd to a socket, one TCP stream from the VM)",
	Paper: "netperf Tx: little FT logging traffic (acknowledgements, transmit completions)",
	Run: func(ctx context.Context, env Env) ([]Measure, error) {
		stop, err := startServer(ctx, env, "stream", streamPort,
			fmt.Sprintf("systemd-socket-activate --listen=%d --accept --inetd dd if=/dev/zero bs=64K status=none", streamPort))
		if err != nil {
			return nil, err
		}
		defer stop()
		conn, err := env.Dial(ctx, "tcp", net.JoinHostPort(env.Addr, strconv.Itoa(streamPort)))
		if err != nil {
			return nil, fmt.Errorf("the stream: %w", err)
		}
		defer func() { _ = conn.Close() }()
		bps, err := readFor(conn, time.Duration(env.seconds())*time.Second)
		if err != nil {
			return nil, fmt.Errorf("the stream: %w", err)
		}
		return []Measure{{Name: "throughput", Unit: "Mbit/s", Value: bps / 1e6, HigherIsBetter: true, Goal: 0.8}}, nil
	},
}

// readFor reads conn for span from its first byte and returns what it read, in bits a second.
func readFor(conn net.Conn, span time.Duration) (float64, error) {
	first := make([]byte, 1)
	if err := conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(conn, first); err != nil {
		return 0, fmt.Errorf("no first byte: %w", err)
	}
	start := time.Now()
	if err := conn.SetReadDeadline(start.Add(span)); err != nil {
		return 0, err
	}
	n, err := io.Copy(io.Discard, conn)
	elapsed := time.Since(start)
	var ne net.Error
	if err != nil && (!errors.As(err, &ne) || !ne.Timeout()) {
		return 0, err
	}
	if err == nil {
		return 0, fmt.Errorf("the VM ended the stream after %s", elapsed.Round(time.Millisecond))
	}
	return float64(n) * 8 / elapsed.Seconds(), nil
}
