// Package bytesize reads and prints byte counts the way kvindex's flags,
// configuration and logs write them: Parse reads "512MiB", "2GiB",
// "1.5GB" or a plain byte count; Value is such a flag; Format prints
// "512MiB", "1.5GiB", and "unlimited" for 0, since every size kvindex
// logs is a limit or a budget whose zero means none.
package bytesize
