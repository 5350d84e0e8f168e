// Command eventsbench measures the library against baselines measured in the
// same run and prints a table; -json writes the same results for tooling.
//
//	go run ./cmd/eventsbench                 # the full suite (a few minutes)
//	go run ./cmd/eventsbench -smoke          # tiny sizes: checks it works
//	go run ./cmd/eventsbench -only receipts  # one section
//
// It uses DATABASE_URL when set (a server where it may create databases),
// otherwise a throwaway PostgreSQL started from the server binaries on the
// machine. Every figure is measured on a fresh database.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/standmeet/events/internal/bench"
	"github.com/standmeet/events/internal/pgtest"
)

func main() {
	var (
		jsonPath = flag.String("json", "", "also write the results as JSON to this file")
		only     = flag.String("only", "", "comma-separated sections: throughput,writepath,operations,webhooks,record,latency,receipts,memory,ordered,backlog,snapshot")
		smoke    = flag.Bool("smoke", false, "tiny sizes, to check that the suite runs")
		evs      = flag.Int("events", 0, "backlog for the throughput runs (default 50000)")
		batch    = flag.Int("batch", 0, "relay batch size (default 200)")
		cpuprof  = flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
		memprof  = flag.String("memprofile", "", "write an allocation profile of the run to this file at its end")
		mdPath   = flag.String("markdown", "", "also write the results as a Markdown table to this file")
		snapFor  = flag.Duration("snapshot-for", 0, "how long each run of the held-snapshot section writes (default 5m)")
		snapW    = flag.Bool("snapshot-writer", false, "the held-snapshot section's held transaction writes too (a BEGIN left open after an UPDATE)")
		latFor   = flag.Duration("latency-for", 0, "how long each steady-rate run of the latency, ordered and backlog sections writes, after a half-second warm-up (default 5s)")
	)
	flag.Parse()
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "eventsbench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	err := run(*jsonPath, *mdPath, *only, *smoke, *evs, *batch, *snapFor, *latFor, *snapW)
	if err == nil && *memprof != "" {
		err = writeAllocs(*memprof)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "eventsbench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// writeAllocs writes the allocation profile of the whole run to path.
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func run(jsonPath, mdPath, only string, smoke bool, evs, batch int, snapFor, latFor time.Duration, snapWriter bool) error {
	ctx := context.Background()
	url, cleanup, err := pgtest.FromEnv(ctx, "DATABASE_URL")
	if err != nil {
		return err
	}
	defer cleanup()
	opts := bench.Options{AdminURL: url, Events: evs, Batch: batch, Log: os.Stderr}
	if smoke {
		opts = bench.SmokeOptions(url)
		opts.Log = os.Stderr
	}
	if latFor > 0 {
		opts.LatencyFor = latFor
	}
	if snapFor > 0 {
		opts.SnapshotFor = snapFor
	}
	opts.SnapshotWriter = snapWriter
	if only != "" {
		opts.Only = map[string]bool{}
		for _, s := range strings.Split(only, ",") {
			opts.Only[strings.TrimSpace(s)] = true
		}
	}
	rep, err := bench.Run(ctx, opts)
	if err != nil {
		return err
	}
	fmt.Printf("eventsbench %s — Go %s, %d CPUs, PostgreSQL %s\n\n", rep.Date.Format(time.DateOnly), rep.GoVersion, rep.CPUs, rep.Postgres)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "section\tmeasure\tvalue\tunit\ttarget\t")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%s\t%s\t%.2f\t%s\t%s\t\n", r.Section, r.Name, r.Value, r.Unit, targetText(r))
	}
	w.Flush()
	fmt.Printf("\nevents lost or fanned out wrongly: %d\n", rep.Lost)
	if jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
			return err
		}
	}
	if mdPath != "" {
		var b strings.Builder
		fmt.Fprintf(&b, "Measured %s — Go %s, %d CPUs, PostgreSQL %s.\n\n", rep.Date.Format(time.DateOnly), rep.GoVersion, rep.CPUs, rep.Postgres)
		b.WriteString("| section | measure | value | unit | target |\n| --- | --- | ---: | --- | --- |\n")
		for _, r := range rep.Results {
			fmt.Fprintf(&b, "| %s | %s | %.2f | %s | %s |\n", r.Section, r.Name, r.Value, r.Unit, targetText(r))
		}
		fmt.Fprintf(&b, "\nEvents lost or fanned out wrongly: %d.\n", rep.Lost)
		if err := os.WriteFile(mdPath, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	if rep.Lost != 0 {
		return fmt.Errorf("%d events lost or fanned out wrongly", rep.Lost)
	}
	return nil
}

// targetText is a result's target with whether it was met.
func targetText(r bench.Result) string {
	switch {
	case r.Met == nil:
		return r.Target
	case *r.Met:
		return r.Target + " ✓"
	default:
		return r.Target + " ✗ missed"
	}
}
