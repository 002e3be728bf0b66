package workloads

import (
	"context"
	"encoding/json"
	"fmt"
)

// fioFile is the file the disk rows read and write, on the guest's data disk (its claim beside
// the root), laid out once by Setup; fioBriefFile the smaller one of a brief run.
const (
	fioFile      = "/srv/data/fio.dat"
	fioFileSize  = "256M"
	fioBriefFile = "/srv/data/fio-brief.dat"
)

// fioRow is a random disk I/O row (the white paper's filebench rows at 2K and 64K): fio in the
// guest, direct I/O (the guest's page cache out of it) through libaio, 16 requests in flight, on
// the data disk, for the run's span.
func fioRow(rw string, kib int) Workload {
	what := map[string]string{"randread": "reads", "randwrite": "writes"}[rw]
	paper := map[string]string{
		"randread":  "filebench random reads: throughput unchanged with FT; the reads go on the FT logging link (2K: 155 Mbit/s, 64K: 1400 Mbit/s)",
		"randwrite": "filebench random writes: throughput unchanged with FT; little FT logging traffic (2K: 3.6 Mbit/s, 64K: 1.96 Mbit/s)",
	}[rw]
	return Workload{
		Name:  fmt.Sprintf("disk-%s-%dk", rw, kib),
		Title: fmt.Sprintf("Random disk %s, %d KiB (fio, direct, 16 in flight)", what, kib),
		Paper: paper,
		Setup: func(ctx context.Context, env Env) error {
			file, size := fioFile, fioFileSize
			if env.Brief {
				file, size = fioBriefFile, "16M"
			}
			out, err := env.Guest(ctx, fmt.Sprintf("test -f %[1]s || sudo fio --name=layout --filename=%[1]s --size=%[2]s --create_only=1 --output-format=terse >/dev/null && sudo sync", file, size))
			if err != nil {
				return fmt.Errorf("laying out %s: %w: %s", file, err, lastLine(out))
			}
			return nil
		},
		Run: func(ctx context.Context, env Env) ([]Measure, error) {
			file, size := fioFile, fioFileSize
			if env.Brief {
				file, size = fioBriefFile, "16M"
			}
			out, err := env.Guest(ctx, fmt.Sprintf("sudo fio --name=%s --filename=%s --size=%s --direct=1 --ioengine=libaio --iodepth=16 --rw=%s --bs=%dk --runtime=%d --time_based --output-format=json",
				rw, file, size, rw, kib, env.seconds()))
			if err != nil {
				return nil, fmt.Errorf("fio: %w: %s", err, lastLine(out))
			}
			r, err := parseFio([]byte(out), rw)
			if err != nil {
				return nil, err
			}
			return []Measure{
				{Name: "throughput", Unit: "MB/s", Value: r.bytesPerSecond / 1e6, HigherIsBetter: true, Goal: 0.9},
				{Name: "completion p50", Unit: "ms", Value: r.p50 / 1e6},
			}, nil
		},
	}
}

type fioResult struct {
	bytesPerSecond float64
	p50            float64 // nanoseconds
}

// parseFio reads the one job's throughput and median completion latency of its reads or writes
// from fio's JSON report.
func parseFio(out []byte, rw string) (fioResult, error) {
	type side struct {
		BWBytes float64 `json:"bw_bytes"`
		ClatNS  struct {
			Percentile map[string]float64 `json:"percentile"`
		} `json:"clat_ns"`
	}
	var r struct {
		Jobs []struct {
			Error int  `json:"error"`
			Read  side `json:"read"`
			Write side `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return fioResult{}, fmt.Errorf("fio's report: %w", err)
	}
	if len(r.Jobs) != 1 || r.Jobs[0].Error != 0 {
		return fioResult{}, fmt.Errorf("fio's report: %d jobs, want one without an error", len(r.Jobs))
	}
	s := r.Jobs[0].Read
	if rw == "randwrite" {
		s = r.Jobs[0].Write
	}
	return fioResult{bytesPerSecond: s.BWBytes, p50: s.ClatNS.Percentile["50.000000"]}, nil
}
