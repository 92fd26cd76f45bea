// Command sarama-paced runs "paced transactions" with IBM/sarama, as
// txnguard.testing.clients.paced_transactions does with the Python clients.
//
// T transactions of N records each go to one partition of one topic, one
// Produce request per record: each record is sent alone (SyncProducer, no
// linger) and its acknowledgement awaited before the next. After each
// acknowledgement the program prints "ACK <t> <i>" on stdout; with
// --ack-handshake it then waits for one line on stdin before going on, so the
// caller can act (freeze a broker) at exactly that point. An abortable error
// aborts the transaction and redoes it with the same values; a fatal one ends
// the program with exit status 1. The last line on stdout is one JSON object:
// {"committed": [...], "aborted": n, "errors": [...], "fatal": null | "...",
// "sarama_version": "v1.61.1"}.
//
// The producer is idempotent and transactional with Sarama's own defaults
// (Producer.Retry.Max 3, Producer.Retry.Backoff 100 ms, Producer.Timeout 10 s)
// unless a flag overrides one. Sarama's log goes to stderr.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

const saramaModule = "github.com/IBM/sarama"

type result struct {
	Committed     []string `json:"committed"`
	Aborted       int      `json:"aborted"`
	Errors        []string `json:"errors"`
	Fatal         *string  `json:"fatal"`
	SaramaVersion string   `json:"sarama_version"`
}

type options struct {
	bootstrap      string
	topic          string
	transactional  string
	partition      int
	transactions   int
	perTransaction int
	gap            time.Duration
	retries        int
	backoff        time.Duration
	kafkaVersion   string
	handshake      bool
	timeout        time.Duration
	quiet          bool
	txnTimeout     time.Duration // 0: Sarama's default
}

func parseFlags() options {
	defaults := sarama.NewConfig()
	var o options
	var gapMs, backoffMs, txnTimeoutMs int
	var timeoutS float64
	flag.StringVar(&o.bootstrap, "bootstrap", "", "bootstrap servers, comma separated (required)")
	flag.StringVar(&o.topic, "topic", "", "topic (required)")
	flag.StringVar(&o.transactional, "transactional-id", "", "transactional id (required)")
	flag.IntVar(&o.partition, "partition", 0, "partition")
	flag.IntVar(&o.transactions, "transactions", 1, "transactions to commit")
	flag.IntVar(&o.perTransaction, "per-transaction", 1, "records per transaction")
	flag.IntVar(&gapMs, "gap-ms", 20, "pause after each acknowledgement (and handshake), in ms")
	flag.IntVar(&o.retries, "retries", defaults.Producer.Retry.Max, "Producer.Retry.Max (Sarama's default)")
	flag.IntVar(&backoffMs, "backoff-ms", int(defaults.Producer.Retry.Backoff/time.Millisecond),
		"Producer.Retry.Backoff in ms (Sarama's default)")
	flag.StringVar(&o.kafkaVersion, "kafka-version", sarama.DefaultVersion.String(),
		"Config.Version (Sarama's DefaultVersion)")
	flag.BoolVar(&o.handshake, "ack-handshake", false, "after each ACK line, wait for one line on stdin")
	flag.IntVar(&txnTimeoutMs, "transaction-timeout-ms", 0,
		"Producer.Transaction.Timeout in ms (0: Sarama's default, 1 min)")
	flag.Float64Var(&timeoutS, "timeout-s", 120, "give up (fatal) after this many seconds")
	flag.BoolVar(&o.quiet, "quiet", false, "no Sarama log on stderr")
	flag.Parse()
	if o.bootstrap == "" || o.topic == "" || o.transactional == "" {
		fmt.Fprintln(os.Stderr, "sarama-paced: --bootstrap, --topic and --transactional-id are required")
		flag.Usage()
		os.Exit(2)
	}
	o.gap = time.Duration(gapMs) * time.Millisecond
	o.backoff = time.Duration(backoffMs) * time.Millisecond
	o.txnTimeout = time.Duration(txnTimeoutMs) * time.Millisecond
	o.timeout = time.Duration(timeoutS * float64(time.Second))
	return o
}

// pacedValues is clients.paced_values: "<transactional id>-t<t>-r<i>".
func pacedValues(transactionalID string, transaction, perTransaction int) []string {
	values := make([]string, perTransaction)
	for i := range values {
		values[i] = fmt.Sprintf("%s-t%d-r%d", transactionalID, transaction, i)
	}
	return values
}

func saramaVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == saramaModule {
				return dep.Version
			}
		}
	}
	return "unknown"
}

func config(o options) (*sarama.Config, error) {
	version, err := sarama.ParseKafkaVersion(o.kafkaVersion)
	if err != nil {
		return nil, err
	}
	cfg := sarama.NewConfig()
	cfg.Version = version
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Transaction.ID = o.transactional
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Return.Successes = true // a SyncProducer needs both
	cfg.Producer.Return.Errors = true
	cfg.Producer.Retry.Max = o.retries
	cfg.Producer.Retry.Backoff = o.backoff
	if o.txnTimeout > 0 {
		cfg.Producer.Transaction.Timeout = o.txnTimeout
	}
	return cfg, nil
}

type runner struct {
	o        options
	producer sarama.SyncProducer
	stdin    *bufio.Reader
	deadline time.Time
}

// acked tells the caller that record i of transaction t was acknowledged and, with the
// handshake, waits until the caller has done what it wanted to do at this point.
func (r *runner) acked(t, i int) error {
	if _, err := fmt.Fprintf(os.Stdout, "ACK %d %d\n", t, i); err != nil {
		return err
	}
	if r.o.handshake {
		if _, err := r.stdin.ReadString('\n'); err != nil {
			return fmt.Errorf("ack handshake: %w", err)
		}
	}
	time.Sleep(r.o.gap)
	return nil
}

// transaction runs one transaction; a non-nil error leaves the producer's state to classify it.
func (r *runner) transaction(t int, values []string) error {
	if err := r.producer.BeginTxn(); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	for i, v := range values {
		msg := &sarama.ProducerMessage{Topic: r.o.topic, Partition: int32(r.o.partition), Value: sarama.StringEncoder(v)}
		if _, _, err := r.producer.SendMessage(msg); err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
		if err := r.acked(t, i); err != nil {
			return &fatalError{err}
		}
	}
	// EndTxn is retried by Sarama (Producer.Transaction.Retry.Max); if those retries run out
	// on retriable errors the producer stays in EndTransaction and a commit may be tried again.
	for {
		err := r.producer.CommitTxn()
		if err == nil || r.producer.TxnStatus()&sarama.ProducerTxnFlagInError != 0 || time.Now().After(r.deadline) {
			if err != nil {
				return fmt.Errorf("commit: %w", err)
			}
			return nil
		}
		log.Printf("sarama-paced: commit of transaction %d failed with %v; committing again", t, err)
		time.Sleep(100 * time.Millisecond)
	}
}

type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

func (r *runner) run(res *result) error {
	for t := 0; t < r.o.transactions; {
		if time.Now().After(r.deadline) {
			return fmt.Errorf("%d/%d transactions within %s; errors %v", t, r.o.transactions, r.o.timeout, res.Errors)
		}
		values := pacedValues(r.o.transactional, t, r.o.perTransaction)
		err := r.transaction(t, values)
		if err == nil {
			res.Committed = append(res.Committed, values...)
			t++
			continue
		}
		var fe *fatalError
		status := r.producer.TxnStatus()
		if errors.As(err, &fe) || status&sarama.ProducerTxnFlagFatalError != 0 ||
			status&sarama.ProducerTxnFlagAbortableError == 0 {
			return fmt.Errorf("transaction %d (status %s): %w", t, status, err)
		}
		res.Errors = append(res.Errors, fmt.Sprintf("transaction %d: %v", t, err))
		res.Aborted++
		if abortErr := r.producer.AbortTxn(); abortErr != nil {
			return fmt.Errorf("abort of transaction %d after %v: %w", t, err, abortErr)
		}
	}
	return nil
}

func closeBounded(p sarama.SyncProducer, within time.Duration) {
	done := make(chan struct{})
	go func() {
		_ = p.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(within):
		log.Printf("sarama-paced: the producer did not close within %s", within)
	}
}

func main() {
	o := parseFlags()
	log.SetOutput(os.Stderr)
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if o.quiet {
		sarama.Logger = log.New(io.Discard, "", 0)
	} else {
		sarama.Logger = log.New(os.Stderr, "[sarama] ", log.LstdFlags|log.Lmicroseconds)
	}
	res := result{Committed: []string{}, Errors: []string{}, SaramaVersion: saramaVersion()}
	err := func() error {
		cfg, err := config(o)
		if err != nil {
			return err
		}
		// NewSyncProducer runs InitProducerId (Sarama's initializeTransactions).
		producer, err := sarama.NewSyncProducer(strings.Split(o.bootstrap, ","), cfg)
		if err != nil {
			return fmt.Errorf("new producer: %w", err)
		}
		defer closeBounded(producer, 10*time.Second)
		r := &runner{o: o, producer: producer, stdin: bufio.NewReader(os.Stdin), deadline: time.Now().Add(o.timeout)}
		return r.run(&res)
	}()
	if err != nil {
		msg := err.Error()
		res.Fatal = &msg
	}
	out, jerr := json.Marshal(res)
	if jerr != nil {
		log.Fatalf("sarama-paced: %v", jerr)
	}
	fmt.Fprintln(os.Stdout, string(out))
	if err != nil {
		os.Exit(1)
	}
}
